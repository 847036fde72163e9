// Command wideworker is the worker of the wide-node benchmark
// (bench/scale_wide.py), equally cheap under every launcher.
//
//	wideworker ready DIR            write DIR/<rank> (pid and start time), then wait for SIGTERM
//	wideworker print LINES PAD DIR  write DIR/<rank>, wait for the end of the FIFO DIR/go, then
//	                                print LINES lines "rank=R seq=S PAD-bytes" as fast as stdio would
//
// The rank comes from RANK, which gorun and torchrun both set.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 5 && !(len(os.Args) == 3 && os.Args[1] == "ready") {
		fail("usage: wideworker print LINES PAD DIR | wideworker ready DIR")
	}
	rank := os.Getenv("RANK")
	if _, err := strconv.Atoi(rank); err != nil {
		fail("RANK is not set to a number")
	}
	switch os.Args[1] {
	case "print":
		lines, err1 := strconv.Atoi(os.Args[2])
		pad, err2 := strconv.Atoi(os.Args[3])
		if err1 != nil || err2 != nil {
			fail("LINES and PAD are numbers")
		}
		// The benchmark holds the FIFO open until every worker is
		// ready, so that all print at once: it times the console, not
		// the launch.
		start, err := os.Open(os.Args[4] + "/go")
		if err != nil {
			fail(err.Error())
		}
		markReady(rank, os.Args[4])
		if _, err := io.Copy(io.Discard, start); err != nil {
			fail(err.Error())
		}
		printLines(rank, lines, pad)
	case "ready":
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM)
		markReady(rank, os.Args[2])
		<-stop
	default:
		fail("unknown mode " + os.Args[1])
	}
}

// printLines writes through a 4 KiB buffer, as C stdio and Python do on a
// pipe, so that writes end in the middle of lines.
func printLines(rank string, lines, pad int) {
	out := bufio.NewWriterSize(os.Stdout, 4096)
	padding := strings.Repeat("x", pad)
	for seq := range lines {
		fmt.Fprintf(out, "rank=%s seq=%d %s\n", rank, seq, padding)
	}
	if err := out.Flush(); err != nil {
		fail(err.Error())
	}
}

// markReady says that the worker runs: the file appears whole (written,
// then renamed) with the worker's pid and the wall clock in nanoseconds.
func markReady(rank, dir string) {
	stamp := fmt.Sprintf("%d %d\n", os.Getpid(), time.Now().UnixNano())
	tmp := dir + "/." + rank
	if err := os.WriteFile(tmp, []byte(stamp), 0o644); err != nil {
		fail(err.Error())
	}
	if err := os.Rename(tmp, dir+"/"+rank); err != nil {
		fail(err.Error())
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "wideworker:", msg)
	os.Exit(2)
}

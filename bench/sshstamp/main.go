// Command sshstamp is the worker of bench/scale_ssh.py: it appends one line,
// "HOSTNAME CLOCK_MONOTONIC-nanoseconds", to the file named by its argument
// and exits. One write with O_APPEND keeps the lines of concurrent workers
// whole; the clock is the one Python's time.monotonic_ns reads, so the
// harness can subtract the moment it started the launcher.
package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func main() {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		fail(err)
	}
	if len(os.Args) != 2 {
		fail(fmt.Errorf("usage: sshstamp FILE"))
	}
	host, err := os.Hostname()
	if err != nil {
		fail(err)
	}
	f, err := os.OpenFile(os.Args[1], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fail(err)
	}
	if _, err := fmt.Fprintf(f, "%s %d\n", host, ts.Nano()); err != nil {
		fail(err)
	}
	if err := f.Close(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sshstamp:", err)
	os.Exit(1)
}

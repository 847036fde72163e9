// Command storeserver serves gorun's rendezvous store, the server every
// gorun agent hosts, on its own, so that bench/compare.py can load it with
// torch's TCPStore clients exactly as it loads torch's own server:
//
//	storeserver -addr 127.0.0.1:0
//	listening on 127.0.0.1:41234
//
// It serves until SIGINT or SIGTERM, then answers the requests in flight
// and exits.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with -pprof
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "storeserver:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on (port 0: an ephemeral port)")
	pprofAddr := flag.String("pprof", "", "also serve net/http/pprof on this address, to profile the server under load")
	maxConns := flag.Int("max-conns", 0, "the server's MaxConns (0: its default; -1: none)")
	fdReserve := flag.Int("fd-reserve", 0, "file descriptors the server leaves to the rest of the process (0: its default; -1: none)")
	flag.Parse()
	if *pprofAddr != "" {
		go func() { _ = http.ListenAndServe(*pprofAddr, nil) }()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	srv := rendezvous.NewServer(rendezvous.ServerOptions{Logger: log, MaxConns: *maxConns, FDReserve: *fdReserve})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	// The one line a benchmark reads to find the port.
	fmt.Printf("listening on %s\n", l.Addr())

	select {
	case err := <-served:
		return fmt.Errorf("serve on %s: %w", l.Addr(), err)
	case <-ctx.Done():
	}
	// The server's figures, for a benchmark to show what it refused or
	// closed (connections evicted, handshakes timed out).
	if b, err := json.Marshal(srv.Stats()); err == nil {
		fmt.Fprintf(os.Stderr, "stats %s\n", b)
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("shut down: %w", err)
	}
	return nil
}

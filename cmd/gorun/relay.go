package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gorun/gorun/launcher"
)

// sshRelayFlag runs gorun as a relay of a tree launch (see
// launcher.RelayPlan): the head, or the relay above, starts it over SSH on
// a host whose share of the hosts it launches.
const sshRelayFlag = "ssh-relay"

// runRelay reads the relay's plan from stdin, starts this host's agent and
// launches the plan's hosts, and returns the subtree's status by the
// head's rules. EOF on the rest of stdin stops the subtree, as SIGTERM does.
func runRelay(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	in := bufio.NewReader(stdin)
	plan, err := launcher.ReadRelayPlan(in)
	if err != nil {
		return 0, err
	}
	log, err := newLogger(stderr, "console", cmp.Or(plan.LogLevel, "warn"))
	if err != nil {
		return 0, err
	}
	f := plan.Fanout()
	f.Stdout, f.Stderr, f.Logger = stdout, stderr, log
	f.SSH.Logger, f.SSH.LookupEnv = log, os.LookupEnv
	f.SelfEnviron = os.Environ()
	if plan.Stage {
		self, err := os.Executable()
		if err != nil {
			return 0, fmt.Errorf("cannot find this gorun's path to stage it: %w", err)
		}
		b, err := launcher.OpenBinary(self)
		if err != nil {
			return 0, err
		}
		f.Stage = &b
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	f.Signals = stopOnStdinEOF(ctx, in, signals, log)
	code, err := f.Run(ctx)
	if err != nil && plan.EventMarker != "" {
		// Hosts of this subtree never started: the job cannot form, and
		// the head stops it at once, as it would have stopped its own
		// launch (the error, naming the host, follows on stderr).
		fmt.Fprintf(stderr, "%s lost\n", plan.EventMarker)
	}
	return code, err
}

package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// progressJob is the command line of node rank of a two-node job on
// loopback, static or c10d, that runs true; conf is the rendezvous
// settings.
func progressJob(t *testing.T, backend string, port, rank int, conf string) []string {
	if backend == "static" {
		return staticJob(port, 2, rank, "--rdzv-conf", conf, "true")
	}
	return []string{"--nnodes", "2", "--nproc-per-node", "1", "--node-rank", strconv.Itoa(rank),
		"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + strconv.Itoa(port),
		"--rdzv-id", strings.ReplaceAll(t.Name(), "/", "-"),
		"--rdzv-conf", "heartbeat_interval=0.25,heartbeat_misses=3," + conf, "true"}
}

// report matches a progress report of a node alone in a two-node job, and
// captures how long it says the wait lasts yet.
var report = regexp.MustCompile(`waiting for nodes joined=1 left=(\S+) max=2 min=2 missing="node rank 1" .*until=`)

// Issue 23: a node that waits for a peer says within 10 s which node is
// missing and how long the wait will last; once the peer comes, the job
// runs.
func TestProgressNamesTheMissingNode(t *testing.T) {
	for _, tc := range []struct {
		backend, conf string
		timeout       time.Duration
	}{
		{"static", "timeout=120", 120 * time.Second},
		{"c10d", "join_timeout=120", 120 * time.Second},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			port := freePort(t)
			first := startAgent(t, progressJob(t, tc.backend, port, 0, tc.conf)...)
			var m []string
			if !waitFor(10*time.Second, func() bool {
				m = report.FindStringSubmatch(first.out.String())
				return m != nil
			}) {
				t.Fatalf("no report naming node rank 1 within 10 s:\n%s", first.out.String())
			}
			left, err := time.ParseDuration(m[1])
			if err != nil || left <= tc.timeout-15*time.Second || left > tc.timeout {
				t.Errorf("report says %q left, want a little under %v:\n%s", m[1], tc.timeout, first.out.String())
			}
			second := startAgent(t, progressJob(t, tc.backend, port, 1, tc.conf)...)
			for _, a := range []*agent{first, second} {
				if code := a.wait(t, 60*time.Second); code != 0 {
					t.Errorf("agent %v exited %d once both nodes came:\n%s", a.cmd.Args, code, a.out.String())
				}
			}
		})
	}
}

// Issue 23: a node that no peer joins before the timeout fails, naming the
// nodes missing, having reported them while it waited.
func TestProgressJoinTimeoutNamesMissingNodes(t *testing.T) {
	for _, tc := range []struct{ backend, conf string }{
		{"static", "timeout=3"},
		{"c10d", "join_timeout=3"},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			start := time.Now()
			a := startAgent(t, progressJob(t, tc.backend, freePort(t), 0, tc.conf)...)
			if code := a.wait(t, 60*time.Second); code == 0 {
				t.Fatalf("a node alone in a two-node job exited 0:\n%s", a.out.String())
			}
			out := a.out.String()
			if !strings.Contains(out, "join timeout after 3s: 1 of") || !strings.Contains(out, "; missing: node rank 1") {
				t.Errorf("the error does not name the missing node:\n%s", out)
			}
			if report.FindString(out) == "" {
				t.Errorf("no report while it waited:\n%s", out)
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("gave up after %v, want about 3 s", took)
			}
		})
	}
}

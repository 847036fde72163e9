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
	if rank != 0 {
		// On one machine, the first agent up hosts the store: node 0.
		conf += ",is_host=false"
	}
	return []string{"--nnodes", "2", "--nproc-per-node", "1", "--node-rank", strconv.Itoa(rank),
		"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + strconv.Itoa(port),
		"--rdzv-id", strings.ReplaceAll(t.Name(), "/", "-"),
		"--rdzv-conf", "heartbeat_interval=0.25,heartbeat_misses=3," + conf, "true"}
}

// The progress reports of a node alone in a two-node job, each capturing
// how long it says the wait lasts yet: node 0 waiting in the round, and
// node 1 waiting for the store that node 0 hosts.
var (
	node1Missing = regexp.MustCompile(`waiting for nodes joined=1 left=(\S+) max=2 min=2 missing="node rank 1" .*until=`)
	node0Missing = regexp.MustCompile(`waiting for the store of node 0 endpoint=\S+ left=(\S+) missing="node rank 0"`)
	hostMissing  = regexp.MustCompile(`waiting for the rendezvous store endpoint=\S+ left=(\S+) missing="the store's host 127.0.0.1"`)
)

var progressCases = []struct {
	name, backend, conf string
	first               int // the rank that comes alone
	report              *regexp.Regexp
	missing             string // what the join timeout's error names
}{
	{"static", "static", "timeout=", 0, node1Missing, "; missing: node rank 1"},
	{"static-node-0-late", "static", "timeout=", 1, node0Missing, "(missing: node rank 0)"},
	{"c10d", "c10d", "join_timeout=", 0, node1Missing, "; missing: node rank 1"},
	{"c10d-store-host-late", "c10d", "read_timeout=", 1, hostMissing, "(missing: its host)"},
}

// Issue 23: a node that waits for a peer says within 10 s which node is
// missing and how long the wait will last; once the peer comes, the job
// runs.
func TestProgressNamesTheMissingNode(t *testing.T) {
	const timeout = 120 * time.Second
	for _, tc := range progressCases {
		t.Run(tc.name, func(t *testing.T) {
			port, conf := freePort(t), tc.conf+"120"
			first := startAgent(t, progressJob(t, tc.backend, port, tc.first, conf)...)
			var m []string
			if !waitFor(10*time.Second, func() bool {
				m = tc.report.FindStringSubmatch(first.out.String())
				return m != nil
			}) {
				t.Fatalf("no report naming the node missing within 10 s:\n%s", first.out.String())
			}
			left, err := time.ParseDuration(m[1])
			if err != nil || left <= timeout-15*time.Second || left > timeout {
				t.Errorf("report says %q left, want a little under %v:\n%s", m[1], timeout, first.out.String())
			}
			second := startAgent(t, progressJob(t, tc.backend, port, 1-tc.first, conf)...)
			for _, a := range []*agent{first, second} {
				if code := a.wait(t, 60*time.Second); code != 0 {
					t.Errorf("agent %v exited %d once both nodes came:\n%s", a.cmd.Args, code, a.out.String())
				}
			}
		})
	}
}

// Issue 23: a node that no peer joins before the timeout fails, naming the
// node missing, having reported it while it waited.
func TestProgressJoinTimeoutNamesMissingNodes(t *testing.T) {
	for _, tc := range progressCases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			a := startAgent(t, progressJob(t, tc.backend, freePort(t), tc.first, tc.conf+"3")...)
			if code := a.wait(t, 60*time.Second); code == 0 {
				t.Fatalf("a node alone in a two-node job exited 0:\n%s", a.out.String())
			}
			out := a.out.String()
			if !strings.Contains(out, tc.missing) {
				t.Errorf("the error does not name the node missing (%q):\n%s", tc.missing, out)
			}
			if tc.report.FindString(out) == "" {
				t.Errorf("no report while it waited:\n%s", out)
			}
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("gave up after %v, want about 3 s", took)
			}
		})
	}
}

package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A rank that stops calling collectives hangs the group: gorun finds it,
// dumps the stuck workers' goroutines, reports the hang and fails.
func TestHangIsDumpedAndReported(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "2", "--hang-timeout", "2s", bin("hang"), "-hang-after", "5")
	if j.code == 0 {
		t.Fatalf("a hung job succeeded:\n%s", j)
	}
	for _, want := range []string{
		"worker group hung",                  // the agent's log
		"SIGQUIT: quit",                      // the workers' dump
		"goroutine 1 ",                       // "goroutine 1 gp=... [select]:"
		"examples/hang/main.go",              // down to the sleeping rank's code
		"hang: no collective progress for 2", // the report
		"rank      : 1 (local_rank: 1)",      // the rank that stopped
		"rank      : 0 (local_rank: 0)",      // rank 0 waits in all_reduce: stuck too
		"exitcode  : 2",                      // Go's status after SIGQUIT
	} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, j)
		}
	}
}

// A hang spends the restart budget like any failure: a group that hangs
// on its first attempt only completes after one restart.
func TestHangRestartsTheGroup(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "1",
		bin("hang"), "-hang-after", "3", "-first-only")
	if j.code != 0 || !strings.Contains(j.stdout, "done: 20 all_reduces of world 2") ||
		!strings.Contains(j.stderr, "worker group hung") || !strings.Contains(j.stderr, "restarting (1/1)") {
		t.Fatalf("want a hang, one restart and success, got:\n%s", j)
	}
}

// Only a counter that moved arms the detector: a program that does not use
// gorun's runtime is never taken for hung, however quiet.
func TestHangTimeoutIgnoresProgramsWithoutTheRuntime(t *testing.T) {
	quiet := script(t, t.TempDir(), "quiet.sh", "sleep 1.5\necho quiet done\n")
	j := gorun(t, nil, "--nproc-per-node", "2", "--hang-timeout", "0.3", quiet)
	if j.code != 0 || strings.Count(j.stdout, "quiet done") != 2 || strings.Contains(j.stderr, "hung") {
		t.Fatalf("want a quiet success, got:\n%s", j)
	}
}

func TestHangTimeoutFlag(t *testing.T) {
	for _, bad := range []string{"soon", "-5s", "-1"} {
		j := gorun(t, nil, "--hang-timeout", bad, "true")
		if j.code != 2 || !strings.Contains(j.stderr, "--hang-timeout") {
			t.Errorf("--hang-timeout %s: want exit 2 naming the flag, got:\n%s", bad, j)
		}
	}
	// Seconds, a duration, and off.
	for _, ok := range []string{"0.5", "1m", "0", ""} {
		if j := gorun(t, nil, "--hang-timeout", ok, "true"); j.code != 0 {
			t.Errorf("--hang-timeout %q: got:\n%s", ok, j)
		}
	}
}

// The hang analysis reads the ranks' flight records: the ranks waiting in
// the next all_reduce name the one that stopped calling them, and the
// sequence number where it fell behind; its stack follows.
func TestHangAnalysisNamesTheLaggard(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "4", "--hang-timeout", "5s", bin("hang"), "-hang-after", "5", "-hang-rank", "3")
	if j.code == 0 {
		t.Fatalf("a hung job succeeded:\n%s", j)
	}
	for _, want := range []string{
		"hang analysis: ranks 0-2 are in all_reduce #6 (float64 x 1) since ",
		", waiting for rank 3",
		"hang analysis: rank 3 completed all_reduce #5 (float64 x 1) and is in no operation since ",
		"\n              ranks 0-2 are in all_reduce #6", // the report keeps it
		"[rank3]: time.Sleep", // rank 3's stack, down to where it sleeps
		// The laggard is the root cause, not a rank that waited for it.
		"Root Cause (first observed failure):\n[0]:\n  time      : ",
	} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, j)
		}
	}
	if root := regexp.MustCompile(`Root Cause \(first observed failure\):\n\[0\]:\n.*\n.*\n  rank      : (\d+)`).FindStringSubmatch(j.stderr); root == nil || root[1] != "3" {
		t.Errorf("the root cause is not rank 3, the laggard: %v\n%s", root, j)
	}
}

// Issue 23: a 2-node c10d job where rank 3 stops calling all_reduce: the
// agents share their flight records through the round's store, so the
// node without rank 3 names it and where it fell behind, and the node
// with rank 3 logs its stacks, asked of its runtime and whole, before the
// stuck workers' SIGQUIT dumps.
func TestHangAnalysisAcrossNodes(t *testing.T) {
	args := elasticJob(t, "2", "--hang-timeout", "5s")
	var agents []*agent
	for range 2 {
		agents = append(agents, startCommandEnv(t, os.Environ(), bin("gorun"),
			append(args[:len(args):len(args)], bin("hang"), "-hang-after", "5", "-hang-rank", "3")...))
	}
	logs := func() string { return agents[0].out.String() + "\n---\n" + agents[1].out.String() }
	for i, a := range agents {
		if code := a.wait(t, 90*time.Second); code == 0 {
			t.Fatalf("agent %d of a hung job succeeded:\n%s", i, logs())
		}
	}
	var with, without string // the outputs of the node with rank 3 and of the other
	for _, a := range agents {
		if out := a.out.String(); strings.Contains(out, "[rank3]:") {
			with = out
		} else {
			without = out
		}
	}
	if with == "" || without == "" {
		t.Fatalf("rank 3 is not on exactly one node:\n%s", logs())
	}
	for _, out := range []string{without, with} {
		for _, want := range []string{
			"hang analysis: ranks 0-2 are in all_reduce #6 (float64 x 1) since ",
			", waiting for rank 3",
			"hang analysis: rank 3 completed all_reduce #5 (float64 x 1) and is in no operation since ",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("an agent's output lacks %q:\n%s", want, logs())
			}
		}
	}
	if strings.Contains(without, "stacks of rank 3") {
		t.Errorf("the node without rank 3 logs its stacks:\n%s", without)
	}
	// Rank 3's stacks, asked of its runtime: one block, down to where it
	// sleeps, before any stuck worker's SIGQUIT dump on its node.
	asked := strings.Index(with, "stacks of rank 3, which holds the others up:")
	dump := strings.Index(with, "]: SIGQUIT: quit")
	if asked < 0 || dump < 0 || asked > dump {
		t.Fatalf("rank 3's stacks are not logged before the dumps (at %d, first dump at %d):\n%s", asked, dump, with)
	}
	block := with[asked:dump]
	if !strings.Contains(block, "time.Sleep") || !strings.Contains(block, "main.run()") || strings.Count(block, "main.main()") != 1 {
		t.Errorf("rank 3's asked stacks are not whole, down to its sleep:\n%s", block)
	}
}

// Issue 23: a rank that dies (as one whose collective timed out would)
// leaves the others inside the operation it left; with the flight
// recorder on, gorun says where every rank stood at the failure.
func TestFailureShowsWhereTheRanksStood(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "4", "--hang-timeout", "10m", bin("hang"), "-hang-after", "5", "-hang-rank", "3", "-exit")
	if j.code != 3 {
		t.Fatalf("want rank 3's exit 3:\n%s", j)
	}
	stood := regexp.MustCompile(`where the ranks stood at the failure: ranks 0-2 (are in|failed) all_reduce #6 \(float64 x 1\)`)
	if !stood.MatchString(j.stderr) ||
		!strings.Contains(j.stderr, "where the ranks stood at the failure: rank 3 completed all_reduce #5 (float64 x 1) and is in no operation") {
		t.Errorf("want where ranks 0-2 and rank 3 stood:\n%s", j)
	}
}

package elastic

import (
	"errors"
	"fmt"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	exit := func(rank, code int, sig syscall.Signal, at time.Duration) launcher.Exit {
		return launcher.Exit{Rank: rank, LocalRank: rank, ExitCode: code, Signal: sig, Time: t0.Add(at)}
	}
	failure := func(round, rank, code int, at time.Duration) Failure {
		return Failure{Exit: exit(rank, code, 0, at), Round: round, Host: "h"}
	}
	stopped := &stopError{syscall.SIGTERM}
	storeDown := errors.New("store down")
	agentFault := errors.New("elastic: log folder: no space")
	failed := outcome{failures: []Failure{failure(0, 1, 3, 0)}}

	tests := []struct {
		name string
		in   news
		want verdict
		// wantErr is the error the verdict returns; rendezvous says it is
		// a *RendezvousError that wraps cause.
		wantErr    string
		rendezvous bool
		cause      error
	}{
		// joined: membership.next returned.
		{name: "joined a round", in: news{step: joined}, want: verdict{do: runWorkers}},
		{name: "signal while joining", in: news{step: joined, err: stopped, restarts: 2},
			want: verdict{do: stopOnSignal, sig: syscall.SIGTERM}},
		{name: "job failed before this node joined", in: news{step: joined, err: rendezvous.ErrJobFailed},
			want: verdict{do: failJob}},
		{name: "job failed, wrapped", in: news{step: joined, err: fmt.Errorf("x: %w", rendezvous.ErrJobFailed), rejoining: true},
			want: verdict{do: failJob}},
		{name: "job ended before this node got a place", in: news{step: joined, err: rendezvous.ErrJobEnded, restarts: 1},
			want: verdict{do: finish, why: jobEnded, result: &Result{}, note: rendezvous.ErrJobEnded}},
		{name: "first join fails", in: news{step: joined, err: storeDown},
			want: verdict{do: finish}, wantErr: "store down", rendezvous: true, cause: storeDown},
		{name: "rejoin fails", in: news{step: joined, err: storeDown, rejoining: true},
			want: verdict{do: finish}, wantErr: "elastic: cannot rejoin the job: store down", rendezvous: true, cause: storeDown},

		// workersEnded: watch returned the attempt's outcome.
		{name: "all workers succeeded", in: news{step: workersEnded, out: outcome{}}, want: verdict{do: awaitExit}},
		{name: "a worker failed", in: news{step: workersEnded, out: failed}, want: verdict{do: reportFailures}},
		{name: "round changed under the workers", in: news{step: workersEnded, out: outcome{changed: true}},
			want: verdict{do: rejoin, why: roundChanged}},
		{name: "round changed as a worker failed: no budget spent",
			in:   news{step: workersEnded, out: outcome{changed: true, failures: failed.failures}},
			want: verdict{do: rejoin, why: roundChanged}},
		{name: "signal stopped the workers", in: news{step: workersEnded, out: outcome{signal: syscall.SIGINT, failures: failed.failures}},
			want: verdict{do: stopOnSignal, sig: syscall.SIGINT}},
		{name: "signal while starting the workers", in: news{step: workersEnded, err: stopped},
			want: verdict{do: stopOnSignal, sig: syscall.SIGTERM}},
		{name: "workers could not start", in: news{step: workersEnded, err: agentFault},
			want: verdict{do: finish}, wantErr: agentFault.Error(), cause: agentFault},
		{name: "the agent's context ended", in: news{step: workersEnded, out: outcome{err: agentFault, changed: true}},
			want: verdict{do: finish}, wantErr: agentFault.Error(), cause: agentFault},

		// failureReported: weighed, then membership.fail answered.
		{name: "budget lasts: restart", in: news{step: failureReported, restart: true},
			want: verdict{do: rejoin, why: workersFailed}},
		{name: "round changed within the grace: rejoin, nothing spent", in: news{step: failureReported, restart: true, superseded: true},
			want: verdict{do: rejoin, why: failedAsRoundChanged}},
		{name: "budget spent", in: news{step: failureReported, restart: false}, want: verdict{do: failJob}},
		{name: "budget spent, said as ErrJobFailed", in: news{step: failureReported, err: rendezvous.ErrJobFailed},
			want: verdict{do: failJob}},
		{name: "budget spent as the round changed", in: news{step: failureReported, superseded: true},
			want: verdict{do: failJob}},
		{name: "signal while weighing the failure", in: news{step: failureReported, err: stopped, superseded: true},
			want: verdict{do: stopOnSignal, sig: syscall.SIGTERM}},
		{name: "the report could not be made", in: news{step: failureReported, err: storeDown, restart: true},
			want: verdict{do: finish}, wantErr: "elastic: report the failure: store down", rendezvous: true, cause: storeDown},

		// barrierPassed: membership.done returned.
		{name: "every node succeeded", in: news{step: barrierPassed, restarts: 2},
			want: verdict{do: finish, why: succeeded, result: &Result{Restarts: 2}}},
		{name: "barrier timed out: success stands", in: news{step: barrierPassed, err: storeDown, restarts: 1},
			want: verdict{do: finish, why: succeeded, result: &Result{Restarts: 1}, note: storeDown}},
		{name: "another node's round changed: run again",
			in:   news{step: barrierPassed, err: fmt.Errorf("%w: node 2 left", rendezvous.ErrRoundChanged)},
			want: verdict{do: rejoin, why: runAgain}},
		{name: "the job failed elsewhere", in: news{step: barrierPassed, err: rendezvous.ErrJobFailed},
			want: verdict{do: failJob}},
		{name: "signal at the barrier", in: news{step: barrierPassed, err: &stopError{syscall.SIGINT}},
			want: verdict{do: stopOnSignal, sig: syscall.SIGINT}},

		// failuresRead: membership.failures returned, the job failed.
		{name: "failed job: the last failed round, root cause first",
			in: news{step: failuresRead, restarts: 3, failures: []Failure{
				failure(0, 0, 1, 0), failure(1, 1, 143, 2*time.Second), failure(1, 0, 7, time.Second), failure(0, 1, 9, 0),
			}},
			want: verdict{do: finish, why: jobFailedCause, result: &Result{ExitCode: 7, Restarts: 3,
				Failures: []Failure{failure(1, 0, 7, time.Second), failure(1, 1, 143, 2*time.Second)}}}},
		{name: "failed job without a report", in: news{step: failuresRead},
			want: verdict{do: finish}, wantErr: "elastic: the job failed without a failure report"},
		{name: "failures unreadable", in: news{step: failuresRead, err: storeDown},
			want: verdict{do: finish}, wantErr: "elastic: read the job's failures: store down", rendezvous: true, cause: storeDown},
		{name: "signal while reading the failures", in: news{step: failuresRead, err: stopped},
			want: verdict{do: stopOnSignal, sig: syscall.SIGTERM}},

		{name: "unknown step", in: news{step: step(99)}, want: verdict{do: finish}, wantErr: "elastic: no policy for step 99"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := decide(tt.in)
			gotErr := got.err
			got.err = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("decide = %+v, want %+v", got, tt.want)
			}
			switch {
			case tt.wantErr == "" && gotErr != nil:
				t.Errorf("err = %v, want none", gotErr)
			case tt.wantErr != "" && (gotErr == nil || gotErr.Error() != tt.wantErr):
				t.Errorf("err = %v, want %q", gotErr, tt.wantErr)
			}
			var re *RendezvousError
			if errors.As(gotErr, &re) != tt.rendezvous {
				t.Errorf("err %v is a RendezvousError: %v, want %v", gotErr, !tt.rendezvous, tt.rendezvous)
			}
			if tt.cause != nil && !errors.Is(gotErr, tt.cause) {
				t.Errorf("err %v does not wrap %v", gotErr, tt.cause)
			}
		})
	}
}

func TestDecideKeepsTheReportedFailures(t *testing.T) {
	fs := []Failure{{Round: 1, Exit: launcher.Exit{Rank: 1, ExitCode: 2, Time: time.Unix(2, 0)}}, {Round: 1, Exit: launcher.Exit{Rank: 0, ExitCode: 1, Time: time.Unix(1, 0)}}}
	decide(news{step: failuresRead, failures: fs})
	if fs[0].Rank != 1 {
		t.Fatalf("decide reordered the failures it was given: %+v", fs)
	}
}

func TestJudgeExit(t *testing.T) {
	ok := launcher.Exit{Rank: 0}
	bad := launcher.Exit{Rank: 0, ExitCode: 3}
	termed := launcher.Exit{Rank: 1, ExitCode: 143, Signal: syscall.SIGTERM}
	killed := launcher.Exit{Rank: 1, ExitCode: 137, Signal: syscall.SIGKILL}
	aborted := launcher.Exit{Rank: 1, ExitCode: 134, Signal: syscall.SIGABRT}
	oneFailure := outcome{failures: []Failure{{}}}
	tests := []struct {
		name string
		in   exitNews
		want exitVerdict
	}{
		{"success", exitNews{exit: ok}, exitVerdict{}},
		{"success while stopping", exitNews{exit: ok, stopping: true, out: oneFailure}, exitVerdict{}},
		{"first failure stops the group and is explained", exitNews{exit: bad},
			exitVerdict{failure: workerFailure, stop: true, explain: true}},
		{"a failure of its own while a failure stops the group", exitNews{exit: aborted, stopping: true, out: oneFailure},
			exitVerdict{failure: workerFailure, stop: true}},
		{"exit status while a failure stops the group", exitNews{exit: bad, stopping: true, out: oneFailure},
			exitVerdict{failure: workerFailure, stop: true}},
		{"the stop's SIGTERM is not a failure", exitNews{exit: termed, stopping: true, out: oneFailure}, exitVerdict{}},
		{"the stop's SIGKILL is not a failure", exitNews{exit: killed, stopping: true, out: oneFailure}, exitVerdict{}},
		{"failure after a signal stopped the group", exitNews{exit: bad, stopping: true, out: outcome{failures: []Failure{{}}, signal: syscall.SIGINT}}, exitVerdict{}},
		{"failure after the round changed", exitNews{exit: bad, stopping: true, out: outcome{failures: []Failure{{}}, changed: true}}, exitVerdict{}},
		{"failure after the context ended", exitNews{exit: bad, stopping: true, out: outcome{failures: []Failure{{}}, err: errors.New("x")}}, exitVerdict{}},
		{"failure while stopping for a signal, none before", exitNews{exit: bad, stopping: true, out: outcome{signal: syscall.SIGTERM}}, exitVerdict{}},
		{"a stuck worker's exit, others still stuck", exitNews{exit: ok, stuck: true, hung: true},
			exitVerdict{failure: hangFailure}},
		{"the last stuck worker's exit stops the group", exitNews{exit: termed, stuck: true, allStuck: true, hung: true, stopping: true},
			exitVerdict{failure: hangFailure, stop: true}},
		{"a worker that was not stuck fails in a hung group", exitNews{exit: bad, hung: true}, exitVerdict{}},
		{"the watchdog reaped a worker", exitNews{exit: killed, byWatchdog: true},
			exitVerdict{failure: watchdogFailure, stop: true}},
		{"the watchdog reaped a worker while stopping", exitNews{exit: killed, byWatchdog: true, stopping: true, out: oneFailure},
			exitVerdict{failure: watchdogFailure, stop: true}},
		{"the watchdog's worker succeeded", exitNews{exit: ok, byWatchdog: true}, exitVerdict{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := judgeExit(tt.in); got != tt.want {
				t.Errorf("judgeExit = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestJudgeSignal(t *testing.T) {
	tests := []struct {
		sig       syscall.Signal
		stopping  bool
		stoppedBy syscall.Signal
		want      signalAction
	}{
		{syscall.SIGUSR1, false, 0, forwardNotice},
		{syscall.SIGUSR2, true, syscall.SIGTERM, forwardNotice},
		{syscall.SIGTERM, false, 0, stopWorkers},
		{syscall.SIGINT, true, 0, stopWorkers}, // stopping for a failure: the signal is forwarded
		{syscall.SIGTERM, true, syscall.SIGINT, killWorkers},
	}
	for _, tt := range tests {
		if got := judgeSignal(tt.sig, tt.stopping, tt.stoppedBy); got != tt.want {
			t.Errorf("judgeSignal(%v, stopping %v, stopped by %v) = %v, want %v", tt.sig, tt.stopping, tt.stoppedBy, got, tt.want)
		}
	}
}

func TestBudgetAndWeighing(t *testing.T) {
	for _, tt := range []struct {
		used, max int
		want      bool
	}{{0, 0, false}, {0, 1, true}, {1, 1, false}, {2, 3, true}} {
		if got := restartsLeft(tt.used, tt.max); got != tt.want {
			t.Errorf("restartsLeft(%d, %d) = %v", tt.used, tt.max, got)
		}
	}
	for _, tt := range []struct {
		nodes int
		grace time.Duration
		want  bool
	}{{1, time.Second, false}, {2, 0, false}, {2, time.Second, true}} {
		if got := weighsFailures(tt.nodes, tt.grace); got != tt.want {
			t.Errorf("weighsFailures(%d, %v) = %v", tt.nodes, tt.grace, got)
		}
	}
}

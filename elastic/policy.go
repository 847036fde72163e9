package elastic

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// The agent's policy. Run and watch wait: on the rendezvous, on the
// workers, on the signals. What they do once a wait ends is decided here,
// by pure functions of what happened, which policy_test.go tests row by
// row: the agent feeds in the news and acts on the verdict, as Nomad's
// restart tracker is fed exit results and asked what to do.

// step names the wait in Run's loop that just ended.
type step int

const (
	// joined: membership.next returned this node's next round, or why
	// there is none.
	joined step = iota
	// workersEnded: watch returned how the attempt of the worker group
	// ended (runRound).
	workersEnded
	// failureReported: the workers' failures were weighed
	// (roundChangesWithin) and reported (membership.fail), which told
	// whether the job restarts.
	failureReported
	// barrierPassed: the workers succeeded and membership.done, the exit
	// barrier, returned.
	barrierPassed
	// failuresRead: the job failed and membership.failures returned
	// every node's failures (jobFailed).
	failuresRead
)

// news is what happened in the wait that ended: the input of decide.
type news struct {
	step step
	// err is what the wait returned: a *stopError when a stop signal cut
	// it short, a rendezvous error (rendezvous.ErrJobFailed, ...), the
	// agent's own error, or nil.
	err error
	// restarts is the job's restart count as of the last round.
	restarts int
	// rejoining (joined): this node ran the workers in an earlier round.
	rejoining bool
	// out (workersEnded) is how the attempt ended.
	out outcome
	// restart (failureReported): the restart budget lasts.
	restart bool
	// superseded (failureReported): the round changed within the
	// failure grace: a lost node, not the workers, made them fail.
	superseded bool
	// failures (failuresRead) are every node's reports, oldest first.
	failures []Failure
}

// action is what the agent does next.
type action int

const (
	// runWorkers starts the workers in the round just joined.
	runWorkers action = iota
	// reportFailures weighs whether a lost node made the workers fail,
	// then reports their failures, which may spend a restart.
	reportFailures
	// awaitExit waits at the exit barrier: the workers succeeded.
	awaitExit
	// rejoin joins the next round, which restarts the workers.
	rejoin
	// stopOnSignal leaves the rendezvous: a signal interrupted the job.
	stopOnSignal
	// failJob reads the failures every node reported: the job failed.
	failJob
	// finish returns: the result, or the agent's own error.
	finish
)

// cause says why, for the agent's log: why it rejoins, why it finishes.
type cause int

const (
	// noCause: nothing to log beyond the verdict's error.
	noCause cause = iota
	// roundChanged: the round changed under the workers, which were
	// stopped to rejoin; no restart is spent.
	roundChanged
	// workersFailed: the workers failed on their own and the budget
	// lasts: the group restarts.
	workersFailed
	// failedAsRoundChanged: the workers failed as the round changed
	// (a node was lost): a report on a superseded round spends nothing.
	failedAsRoundChanged
	// runAgain: another node's round changed after this node's workers
	// succeeded: the job runs again.
	runAgain
	// jobEnded: the job ended before this node got a place.
	jobEnded
	// succeeded: every worker succeeded.
	succeeded
	// jobFailedCause: the job failed; the result names the root cause.
	jobFailedCause
)

// verdict is what to do: the output of decide.
type verdict struct {
	do  action
	why cause
	// sig is the signal that stopped the job (stopOnSignal).
	sig syscall.Signal
	// result (finish) is the job's result on this node; nil with err.
	result *Result
	// err (finish) is the agent's own failure: Run returns it.
	err error
	// note (finish) is an error the result stands despite, for the log:
	// the exit barrier broke, the job ended before this node joined.
	note error
}

// decide tells what the agent does once a wait ends. A stop signal wins
// in every step; past it, each step has its own rules.
func decide(n news) verdict {
	if sig := stopSignal(n.err); sig != 0 {
		return verdict{do: stopOnSignal, sig: sig}
	}
	switch n.step {
	case joined:
		return afterJoin(n)
	case workersEnded:
		return afterWorkers(n)
	case failureReported:
		return afterReport(n)
	case barrierPassed:
		return afterBarrier(n)
	case failuresRead:
		return afterFailuresRead(n)
	}
	return finishWith(fmt.Errorf("elastic: no policy for step %d", n.step))
}

func afterJoin(n news) verdict {
	switch {
	case errors.Is(n.err, rendezvous.ErrJobFailed):
		return verdict{do: failJob}
	case errors.Is(n.err, rendezvous.ErrJobEnded):
		return verdict{do: finish, why: jobEnded, result: &Result{}, note: n.err}
	case n.err != nil && n.rejoining:
		return finishWith(&RendezvousError{fmt.Errorf("elastic: cannot rejoin the job: %w", n.err)})
	case n.err != nil:
		return finishWith(&RendezvousError{n.err})
	}
	return verdict{do: runWorkers}
}

// afterWorkers: a signal stops the job; a round change restarts the
// workers without spending the budget; failures are weighed and
// reported; success waits at the exit barrier.
func afterWorkers(n news) verdict {
	out := n.out
	switch {
	case n.err != nil:
		return finishWith(n.err)
	case out.signal != 0:
		return verdict{do: stopOnSignal, sig: out.signal}
	case out.err != nil:
		return finishWith(out.err)
	case out.changed:
		return verdict{do: rejoin, why: roundChanged}
	case len(out.failures) > 0:
		return verdict{do: reportFailures}
	}
	return verdict{do: awaitExit}
}

// afterReport: the membership spent a restart, or spent nothing for a
// superseded round, or found the budget spent.
func afterReport(n news) verdict {
	switch {
	case n.err != nil && !errors.Is(n.err, rendezvous.ErrJobFailed):
		return finishWith(&RendezvousError{fmt.Errorf("elastic: report the failure: %w", n.err)})
	case !n.restart:
		return verdict{do: failJob}
	case n.superseded:
		return verdict{do: rejoin, why: failedAsRoundChanged}
	}
	return verdict{do: rejoin, why: workersFailed}
}

// afterBarrier: the job succeeded unless the round changed (run again) or
// the job failed elsewhere first; a barrier that broke (a timeout) leaves
// this node's success standing.
func afterBarrier(n news) verdict {
	switch {
	case errors.Is(n.err, rendezvous.ErrRoundChanged):
		return verdict{do: rejoin, why: runAgain}
	case errors.Is(n.err, rendezvous.ErrJobFailed):
		return verdict{do: failJob}
	}
	return verdict{do: finish, why: succeeded, result: &Result{Restarts: n.restarts}, note: n.err}
}

// afterFailuresRead: the job's result is the last failed round's
// failures, on every node, root cause first, and its exit status.
func afterFailuresRead(n news) verdict {
	if n.err != nil {
		return finishWith(&RendezvousError{fmt.Errorf("elastic: read the job's failures: %w", n.err)})
	}
	if len(n.failures) == 0 {
		return finishWith(errors.New("elastic: the job failed without a failure report"))
	}
	last := lastRoundFailures(n.failures)
	return verdict{do: finish, why: jobFailedCause,
		result: &Result{Failures: last, ExitCode: last[0].ExitCode, Restarts: n.restarts}}
}

// finishWith ends Run with the agent's own error, which says it all.
func finishWith(err error) verdict { return verdict{do: finish, why: noCause, err: err} }

// lastRoundFailures returns, in a new slice, the failures of the last
// round that has any, root cause first.
func lastRoundFailures(fs []Failure) []Failure {
	last := fs[:0:0]
	for _, f := range fs {
		if len(last) > 0 && f.Round > last[0].Round {
			last = last[:0]
		}
		if len(last) == 0 || f.Round == last[0].Round {
			last = append(last, f)
		}
	}
	sortRootCauseFirst(last)
	return last
}

// restartsLeft is the static rendezvous's budget: a node restarts its
// group while it has used fewer than --max-restarts restarts.
func restartsLeft(used, max int) bool { return used < max }

// weighsFailures tells whether a failure is weighed before it is reported
// (roundChangesWithin): only among several nodes, where another's death
// kills this node's workers too, and with a grace to wait.
func weighsFailures(nodes int, grace time.Duration) bool { return nodes > 1 && grace > 0 }

// failureKind says how an exit counts in the attempt's outcome.
type failureKind int

const (
	// notAFailure: a success, or the consequence of a stop.
	notAFailure failureKind = iota
	// hangFailure: a worker that --hang-timeout found stuck exited
	// (hangCheck.failure), however it exited.
	hangFailure
	// watchdogFailure: the file-timer watchdog reaped the worker, which
	// failed (reapedScope.failure).
	watchdogFailure
	// workerFailure: the worker failed on its own.
	workerFailure
)

// exitNews is what watch knows when a worker exits.
type exitNews struct {
	exit launcher.Exit
	// stuck: the hang check found this worker stuck; allStuck: every
	// stuck worker has now exited.
	stuck, allStuck bool
	// byWatchdog: the file-timer watchdog signalled this worker.
	byWatchdog bool
	// hung: the hang check found the group hung.
	hung bool
	// stopping: the group is being stopped.
	stopping bool
	// out is the attempt's outcome so far.
	out outcome
}

// exitVerdict is what watch does with an exit.
type exitVerdict struct {
	failure failureKind
	// stop stops the group (SIGTERM).
	stop bool
	// explain asks the hang check why the first failure came (the ranks
	// that lagged).
	explain bool
}

// judgeExit counts an exit. The stuck workers' exits are the hang's
// failures, and the group stops once all of them have exited; a failed
// exit is a failure of its own unless the group hung or is stopping for
// another reason (failedOnItsOwn); the first failure stops the group.
func judgeExit(n exitNews) exitVerdict {
	failed := n.exit.Failed()
	switch {
	case n.stuck:
		return exitVerdict{failure: hangFailure, stop: n.allStuck}
	case n.byWatchdog && failed:
		return exitVerdict{failure: watchdogFailure, stop: true}
	case failed && !n.hung && (!n.stopping || failedOnItsOwn(n.exit, n.out)):
		return exitVerdict{failure: workerFailure, stop: true, explain: !n.stopping}
	}
	return exitVerdict{failure: notAFailure}
}

// failedOnItsOwn tells, once a failure has begun to stop the group,
// whether another failed exit is a failure of its own rather than the
// stop's doing: workers that fail together (one rank exits, its peers'
// collectives fail) are seen in any order, and the one that failed first
// must not be lost among the others. Exits by the stop's SIGTERM or
// SIGKILL, and any exit after a signal or a round change stopped the
// group, are the stop's doing.
func failedOnItsOwn(e launcher.Exit, out outcome) bool {
	return len(out.failures) > 0 && out.signal == 0 && !out.changed && out.err == nil &&
		e.Signal != syscall.SIGTERM && e.Signal != syscall.SIGKILL
}

// signalAction is what watch does with a signal.
type signalAction int

const (
	// forwardNotice passes a notice (isNotice) to the workers; the job
	// goes on.
	forwardNotice signalAction = iota
	// stopWorkers stops the group with the signal, which it forwards
	// first if the group is already stopping for another reason.
	stopWorkers
	// killWorkers: a second stop signal kills the workers at once.
	killWorkers
)

// judgeSignal: notices are forwarded; the first stop signal stops the
// workers with it; a second one, while the first is acted on, kills them.
func judgeSignal(sig syscall.Signal, stopping bool, stoppedBy syscall.Signal) signalAction {
	switch {
	case isNotice(sig):
		return forwardNotice
	case stopping && stoppedBy != 0:
		return killWorkers
	}
	return stopWorkers
}

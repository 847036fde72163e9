package elastic

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/launcher"
)

// Hang detection (--hang-timeout). Every worker gets a progress file in
// its log folder, named by GORUN_PROGRESS_FILE (workerenv.ProgressFile):
// an 8-byte counter, in the host's byte order, that the runtime advances
// once when Init has joined the job and once per operation (collective,
// point-to-point message, monitored barrier) that completes. The agent reads the counters
// periodically. A worker whose counter has moved at least once and then
// stood still for the hang timeout is stuck, and a stuck worker means the
// group hangs. A counter that never moves arms nothing: programs that do
// not use the runtime (Python, shell) are never taken for hung, nor is a
// worker that has not finished Init.
//
// On a hang the agent logs the stuck ranks and its analysis of the
// workers' flight records (see flight.go), sends each stuck worker's
// process group, those that hold the others up first, a signal that makes
// it print its stacks (SIGQUIT: a Go program prints every goroutine's
// stack to stderr and exits with status 2; SIGABRT for Python, whose
// faulthandler, when enabled, dumps the threads), waits up to
// hangDumpWait for them to exit, then stops the group. The stuck ranks
// are the attempt's failures, with the message "hang: no collective
// progress for D" and the analysis in the traceback, and the usual
// failure path follows: a restart while the budget lasts, else the
// report.
const (
	// progressFileName is the counter's file in a worker's log folder.
	progressFileName = "progress"
	// hangDumpWait bounds the wait for the stuck workers to dump their
	// stacks and exit before the group is stopped.
	hangDumpWait = 2 * time.Second
)

// hangCheckPeriod is how often the counters are read: a tenth of the
// timeout, within 100 ms and 5 s.
func hangCheckPeriod(timeout time.Duration) time.Duration {
	return min(max(timeout/10, 100*time.Millisecond), 5*time.Second)
}

// progressFile is a worker's progress counter, as the agent made it.
type progressFile struct {
	localRank, rank int
	path            string
}

// createProgressFile makes the zeroed counter of a worker in its log
// folder dir.
func createProgressFile(dir *launcher.LogDir, localRank, rank int) (progressFile, error) {
	f, err := dir.Create(progressFileName)
	if err == nil {
		_, err = f.Write(make([]byte, 8))
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return progressFile{}, fmt.Errorf("elastic: progress file of local rank %d: %w", localRank, err)
	}
	return progressFile{localRank: localRank, rank: rank, path: f.Name()}, nil
}

// hangWatch tells stuck workers from their progress counters. It is
// owned by one goroutine.
type hangWatch struct {
	timeout time.Duration
	now     func() time.Time
	workers map[int]*workerProgress // by local rank, while the worker lives
}

// workerProgress is what hangWatch knows of one worker's counter.
type workerProgress struct {
	rank  int
	read  func() (uint64, error)
	count uint64
	armed bool      // the counter has moved: the worker uses the runtime
	since time.Time // of the last move
}

// stuckWorker is a worker whose counter has stood still too long.
type stuckWorker struct {
	localRank, rank int
	idle            time.Duration
}

func newHangWatch(timeout time.Duration, now func() time.Time) *hangWatch {
	return &hangWatch{timeout: timeout, now: now, workers: make(map[int]*workerProgress)}
}

// add watches the counter that read returns, of a worker just started.
func (h *hangWatch) add(localRank, rank int, read func() (uint64, error)) {
	h.workers[localRank] = &workerProgress{rank: rank, read: read, since: h.now()}
}

// forget stops watching a worker, which has exited: its counter stands
// still from now on for a good reason.
func (h *hangWatch) forget(localRank int) { delete(h.workers, localRank) }

// check reads every counter and returns the stuck workers, by local rank.
// A counter that cannot be read counts as unchanged.
func (h *hangWatch) check() []stuckWorker { return h.stalled(h.timeout) }

// stalled reads every counter and returns, by local rank, the armed
// workers whose counters have stood still for least or longer.
func (h *hangWatch) stalled(least time.Duration) []stuckWorker {
	now := h.now()
	var stuck []stuckWorker
	for lr, w := range h.workers {
		if n, err := w.read(); err == nil && n != w.count {
			w.count, w.armed, w.since = n, true, now
			continue
		}
		if idle := now.Sub(w.since); w.armed && idle >= least {
			stuck = append(stuck, stuckWorker{localRank: lr, rank: w.rank, idle: idle})
		}
	}
	slices.SortFunc(stuck, func(a, b stuckWorker) int { return a.localRank - b.localRank })
	return stuck
}

// hangCheck runs a hangWatch for the agent's watch loop: it reads the
// counters on a ticker, dumps the stacks of the stuck workers, and turns
// their exits into failures. A nil *hangCheck (--hang-timeout off) does
// nothing and its channels are nil.
type hangCheck struct {
	watch    *hangWatch
	files    []*os.File
	ticker   *time.Ticker
	log      zerolog.Logger
	dumpSig  syscall.Signal
	pids     []int // by local rank
	stuck    map[int]stuckWorker
	pending  int       // stuck workers not yet exited
	found    time.Time // when the hang was found
	dumpWait <-chan time.Time
	analysis string             // of the flight records, when the hang was found
	flight   map[int]rankReader // the workers' files, by local rank
	share    *flightShare       // with the other nodes; nil: one node
	stacks   map[int]string     // the workers' stacks sockets, by rank
	ctx      context.Context    // the watch's

	// elsewhere receives once another node found the hang and this node
	// answered it (the share's goroutine sends, after the analysis);
	// hungElsewhere is set as the answer begins.
	elsewhere     chan struct{}
	hungElsewhere atomic.Bool

	// The analysis is made once, by check or, when another node found
	// the hang first, by the goroutine that answered it.
	analysed  sync.Mutex
	lines     []string
	laggards  []int
	madeLines bool
	// afterFailure: the analysis explains a worker's failure (a
	// collective's timeout, an error), not a hang.
	afterFailure bool
	explaining   sync.WaitGroup // stop waits for it before closing the files
}

// explainFailure logs, once and without holding up the caller, where
// every rank stood when a worker failed: a collective that timed out, or
// a rank that died, leaves the others inside the operation it left.
func (h *hangCheck) explainFailure() {
	if h == nil || len(h.flight) == 0 {
		return
	}
	h.analysed.Lock()
	made := h.madeLines
	if !made {
		h.afterFailure = true
	}
	h.analysed.Unlock()
	if !made {
		h.explaining.Go(func() { h.analyse() })
	}
}

// analyse gathers every node's flight records (this node's alone with
// one node), logs the analysis and the stacks of this node's laggards,
// and returns it; once: later calls return the first one's.
func (h *hangCheck) analyse() (lines []string, laggards []int) {
	h.analysed.Lock()
	defer h.analysed.Unlock()
	if h.madeLines {
		return h.lines, h.laggards
	}
	all, missing := h.share.gather(h.ctx, h.flights(), h.afterFailure, hangGatherWait)
	lines, laggards = analyzeHang(all, h.watch.now())
	if len(missing) > 0 {
		lines = append(lines, fmt.Sprintf("node(s) %v sent no flight records within %s: the analysis lacks their ranks", missing, hangGatherWait))
	}
	label := "hang analysis: "
	if h.afterFailure {
		label = "where the ranks stood at the failure: "
	}
	for _, l := range lines {
		h.log.Error().Msg(label + l)
	}
	h.logLaggardStacks(laggards)
	h.lines, h.laggards, h.madeLines = lines, laggards, true
	return lines, laggards
}

// rankReader reads a worker's progress file.
type rankReader struct {
	rank int
	f    *os.File
}

// flights reads the flight records of this node's workers, by rank.
func (h *hangCheck) flights() []rankFlight {
	var out []rankFlight
	for _, r := range h.flight {
		b := make([]byte, 64<<10)
		n, _ := r.f.ReadAt(b, 0) // a short read is the whole file
		out = append(out, rankFlight{rank: r.rank, ops: decodeFlight(b[:n])})
	}
	slices.SortFunc(out, func(a, b rankFlight) int { return a.rank - b.rank })
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// startHangCheck watches att's progress files when --hang-timeout is on.
func (a *Agent) startHangCheck(ctx context.Context, att *attempt) *hangCheck {
	if a.spec.HangTimeout <= 0 || len(att.progress) == 0 {
		return nil
	}
	h := &hangCheck{
		watch:   newHangWatch(a.spec.HangTimeout, a.now),
		ticker:  time.NewTicker(hangCheckPeriod(a.spec.HangTimeout)),
		log:     a.log,
		dumpSig: syscall.SIGQUIT,
		pids:    att.group.Pids(),
		flight:  make(map[int]rankReader),
		stacks:  make(map[int]string),
		ctx:     ctx,
	}
	if a.spec.Python {
		h.dumpSig = syscall.SIGABRT
	}
	for _, p := range att.progress {
		f, err := os.Open(p.path)
		if err != nil {
			a.log.Warn().Err(err).Int("local_rank", p.localRank).Msg("hang detection is blind to this worker")
			continue
		}
		h.files = append(h.files, f)
		h.flight[p.localRank] = rankReader{rank: p.rank, f: f}
		h.watch.add(p.localRank, p.rank, func() (uint64, error) { return readCounter(f) })
		if sock := att.stacks[p.localRank]; sock != "" {
			h.stacks[p.rank] = sock
		}
	}
	if r := att.round; r != nil && r.store != nil && r.ranks.GroupWorldSize > 1 {
		h.elsewhere = make(chan struct{}, 1) // answered once
		h.share = &flightShare{
			store: r.store, restart: r.restarts, node: r.ranks.GroupRank, nodes: r.ranks.GroupWorldSize,
			read: h.flights, log: a.log, period: hangCheckPeriod(a.spec.HangTimeout),
			onAnswer: h.answered,
		}
		h.share.start(ctx)
	}
	return h
}

// warnHangTimeoutBlind warns that --hang-timeout cannot see workers that
// do not use the runtime, and points to what can.
func (a *Agent) warnHangTimeoutBlind() {
	if a.spec.HangTimeout > 0 && a.spec.Python {
		a.log.Warn().Msg("--hang-timeout only sees workers that use gorun's Go runtime: it has no effect on Python workers; " +
			"for them, set TORCHELASTIC_ENABLE_FILE_TIMER=1 and wrap steps in torch.distributed.elastic.timer.expires(after=...)")
	}
}

func readCounter(f *os.File) (uint64, error) {
	var b [8]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return 0, err
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// tick fires when the counters are due to be read.
func (h *hangCheck) tick() <-chan time.Time {
	if h == nil || h.stuck != nil {
		return nil
	}
	return h.ticker.C
}

// dumped fires when the stuck workers have had their time to dump.
func (h *hangCheck) dumped() <-chan time.Time {
	if h == nil {
		return nil
	}
	return h.dumpWait
}

// answered follows this node's answer to another node's request for
// its records (on the answering goroutine): it makes the analysis too,
// labelled as that node's, and for a hang then tells the watch loop,
// which dumps this node's stalled workers (checkElsewhere).
func (h *hangCheck) answered(hang bool) {
	h.analysed.Lock()
	if !h.madeLines {
		h.afterFailure = !hang
	}
	h.analysed.Unlock()
	if hang {
		h.hungElsewhere.Store(true)
	}
	h.analyse()
	if hang {
		h.elsewhere <- struct{}{}
	}
}

// foundElsewhere fires when another node found the job hung and this
// node has answered with its records and logged the analysis; nil once
// this node found the hang itself.
func (h *hangCheck) foundElsewhere() <-chan struct{} {
	if h == nil || h.stuck != nil {
		return nil
	}
	return h.elsewhere
}

// hung reports whether a hang was found.
func (h *hangCheck) hung() bool { return h != nil && h.stuck != nil }

// foundByAnother reports whether another node found the job hung and
// asked for this node's records.
func (h *hangCheck) foundByAnother() bool { return h != nil && h.hungElsewhere.Load() }

// dumping reports whether stuck workers are dumping their stacks: a stop
// now would cut their dumps short.
func (h *hangCheck) dumping() bool { return h.hung() && h.pending > 0 }

// check reads the counters; on a hang it logs the stuck ranks and
// signals them to dump their stacks.
func (h *hangCheck) check() {
	h.dump(h.watch.check(), "worker group hung: no collective progress; dumping the stuck workers' stacks")
}

// checkElsewhere follows another node that found the job hung, and will
// stop it: this node's workers that have made no progress for a check
// period dump their stacks too, before the stop reaches them, as they
// would have had this node seen the hang first (its counters, read a
// period apart from the other node's, may not have shown it yet).
func (h *hangCheck) checkElsewhere() {
	h.dump(h.watch.stalled(hangCheckPeriod(h.watch.timeout)),
		"another node found the job hung; dumping the stacks of this node's workers that made no progress")
}

// dump logs stuck, the workers of a hang, and the analysis, and signals
// them to dump their stacks, the laggards first.
func (h *hangCheck) dump(stuck []stuckWorker, msg string) {
	if len(stuck) == 0 {
		return
	}
	h.found = h.watch.now()
	h.stuck = make(map[int]stuckWorker, len(stuck))
	ranks := make([]int, len(stuck))
	for i, s := range stuck {
		h.stuck[s.localRank] = s
		ranks[i] = s.rank
	}
	h.pending = len(stuck)
	h.log.Error().Str("event", eventHang).Ints("ranks", ranks).Str("idle", roundIdle(stuck[0].idle).String()).
		Str("signal", signalName(h.dumpSig)).Msg(msg)
	lines, laggards := h.analyse()
	h.analysis = strings.Join(lines, "\n")
	// The laggards dump first, so that the stacks of the ranks that hold
	// the others up lead.
	slices.SortStableFunc(stuck, func(a, b stuckWorker) int {
		return cmp.Compare(b2i(!slices.Contains(laggards, a.rank)), b2i(!slices.Contains(laggards, b.rank)))
	})
	for _, s := range stuck {
		if err := syscall.Kill(-h.pids[s.localRank], h.dumpSig); err != nil && !errors.Is(err, syscall.ESRCH) {
			h.log.Warn().Err(err).Int("rank", s.rank).Msg("signalling a stuck worker")
		}
	}
	h.dumpWait = time.After(hangDumpWait)
}

// exited stops watching the worker of localRank, which has exited, and
// reports whether it was a stuck one and whether every stuck worker has
// now exited.
func (h *hangCheck) exited(localRank int) (stuck, allExited bool) {
	if h == nil {
		return false, false
	}
	h.watch.forget(localRank)
	if _, ok := h.stuck[localRank]; !ok {
		return false, false
	}
	h.pending--
	return true, h.pending == 0
}

// failure is f, the exit of the stuck worker in slot, told as the hang:
// its message says so (what the worker's error file said moves to the
// traceback), it dates from when the hang was found, and it is a failure
// however the worker exited.
func (h *hangCheck) failure(slot int, f Failure) Failure {
	msg := "hang: no collective progress for " + roundIdle(h.stuck[slot].idle).String()
	info := &launcher.ErrorInfo{Message: msg, Timestamp: h.found, Traceback: h.analysis}
	if f.Error != nil {
		info.Traceback = joinLines(h.analysis, joinLines(f.Error.Message, f.Error.Traceback))
	}
	// The ranks that waited for the laggards are not the hang's cause:
	// the report puts a laggard first.
	info.Collateral = len(h.laggards) > 0 && !slices.Contains(h.laggards, f.Rank)
	f.Error = info
	if f.ExitCode == 0 {
		f.ExitCode = 1
	}
	return f
}

// stop releases the ticker and the files.
func (h *hangCheck) stop() {
	if h == nil {
		return
	}
	h.ticker.Stop()
	h.explaining.Wait()
	h.share.close()
	for _, f := range h.files {
		f.Close()
	}
}

// roundIdle rounds a duration for people: to 100 ms under a minute, else
// to the second.
func roundIdle(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Second)
}

func joinLines(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "\n" + b
}

// logLaggardStacks logs the stacks of the laggards of this node that
// answer for them (Go workers), each whole in one message, before the
// stuck workers' dumps interleave on stderr.
func (h *hangCheck) logLaggardStacks(laggards []int) {
	for _, rank := range laggards {
		sock, ok := h.stacks[rank]
		if !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(h.ctx, hangDumpWait)
		stacks, err := askStacks(ctx, sock)
		cancel()
		if err != nil {
			// After a failure the group is being stopped: a laggard
			// gone already is no news.
			lvl := zerolog.WarnLevel
			if h.afterFailure {
				lvl = zerolog.DebugLevel
			}
			h.log.WithLevel(lvl).Err(err).Int("rank", rank).Msg("asking a laggard for its stacks")
			continue
		}
		h.log.Error().Msgf("stacks of rank %d, which holds the others up:\n%s", rank, strings.TrimRight(stacks, "\n"))
	}
}

package elastic

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/launcher"
)

// The file-timer watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1), as torch's
// FileTimerServer serves it (torch.distributed.elastic.timer, file-based
// local timer, 1.13 and 2.x alike). The agent makes a named pipe and
// names it to every worker in TORCHELASTIC_TIMER_FILE. A worker's
// FileTimerClient opens the pipe for writing without blocking (so that it
// fails at once when no server reads), writes one JSON line and closes it:
//
//	{"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": 1700000000.5, "signal": 9}
//
// expiration_time is in seconds of the Unix epoch; a negative one (the
// client sends -1, with signal 0) releases the scope. A scope is keyed by
// (pid, scope_id): acquiring it again replaces it. Once a scope's time has
// come (expiration_time <= now), every timer of its pid is cleared and the
// worker is sent the signal of its first expired scope, by expiry, that
// asked for one (a signal <= 0 reaps nothing).
//
// Unlike torch's server, which signals any pid a line names, the agent
// acts only for the pids of its own live workers, and kills the worker
// alone (the launcher stops the rest of its process group when it is
// reaped). The worker's exit is a failure of the group, which restarts
// while the budget lasts, and the report names the scope. torch 2.x's
// server also kills its own agent after reaping; gorun does not.
const (
	// timerFileEnv names the pipe in the workers' environment.
	timerFileEnv = "TORCHELASTIC_TIMER_FILE"
	// timerFileName is the pipe in an attempt's log folder, when the
	// user named none.
	timerFileName = "watchdog_timer"
	// maxTimerLine bounds a request line: torch's client refuses to send
	// more than PIPE_BUF (4 KiB) at once. Longer lines are skipped whole.
	maxTimerLine = 64 << 10
	// maxTimerScopes bounds the scopes held at once, so that a worker
	// acquiring scope after scope cannot grow the agent without end, nor
	// slow its loop, which looks at them all on every request.
	maxTimerScopes = 1 << 12
	// timerRecheck is the longest the agent waits before it looks at the
	// clock again while a scope is held: expiry is by the wall clock,
	// which may step.
	timerRecheck = time.Second
	// maxComplaints is how many bad requests of one kind are logged per
	// attempt: a worker must not flood the agent's log.
	maxComplaints = 10
	// neverSeconds caps expiration times, as "never": the Unix second of
	// 2242, well inside time.Time's range.
	neverSeconds = 1 << 33
	// maxSignal is Linux's highest signal number (SIGRTMAX).
	maxSignal = 64
)

// timerKey names a scope: torch keys timers by pid and scope.
type timerKey struct {
	pid   int
	scope string
}

// timerRequest is one parsed line of the protocol.
type timerRequest struct {
	timerKey
	// expires is when the scope expires; release says the request
	// releases the scope instead.
	expires time.Time
	release bool
	signal  syscall.Signal // 0: reap nothing
}

// wireTimerRequest is a request line as torch's client writes it. Every
// field but version is required, as torch's server requires them.
type wireTimerRequest struct {
	Version        *int     `json:"version"`
	Pid            *int     `json:"pid"`
	ScopeID        *string  `json:"scope_id"`
	ExpirationTime *float64 `json:"expiration_time"`
	Signal         *int     `json:"signal"`
}

// errBadTimerRequest marks a line that is not a timer request.
var errBadTimerRequest = errors.New("elastic: bad watchdog request")

// parseTimerRequest reads one request line. Python writes NaN and
// Infinity as bare words, which are not JSON: such a line is refused, as
// torch would keep a timer that never expires.
func parseTimerRequest(line []byte) (timerRequest, error) {
	var w wireTimerRequest
	if err := json.Unmarshal(line, &w); err != nil {
		return timerRequest{}, fmt.Errorf("%w: %w", errBadTimerRequest, err)
	}
	switch {
	case w.Pid == nil || w.ScopeID == nil || w.ExpirationTime == nil || w.Signal == nil:
		return timerRequest{}, fmt.Errorf("%w: want pid, scope_id, expiration_time and signal", errBadTimerRequest)
	case *w.Pid <= 0:
		// kill(0) and kill(-1) would reach far more than a worker.
		return timerRequest{}, fmt.Errorf("%w: pid %d", errBadTimerRequest, *w.Pid)
	case *w.Signal > maxSignal:
		return timerRequest{}, fmt.Errorf("%w: %d is not a signal", errBadTimerRequest, *w.Signal)
	}
	r := timerRequest{
		timerKey: timerKey{pid: *w.Pid, scope: *w.ScopeID},
		release:  *w.ExpirationTime < 0,
		signal:   syscall.Signal(max(*w.Signal, 0)),
	}
	if !r.release {
		r.expires = unixSeconds(*w.ExpirationTime)
	}
	return r, nil
}

// unixSeconds is the time s seconds after the Unix epoch, s >= 0; times
// beyond neverSeconds are neverSeconds.
func unixSeconds(s float64) time.Time {
	sec, frac := math.Modf(min(s, neverSeconds))
	return time.Unix(int64(sec), int64(frac*1e9))
}

// timerScope is a scope a worker holds.
type timerScope struct {
	timerKey
	expires time.Time
	signal  syscall.Signal
	// acquired is when the request arrived: expires-acquired is how long
	// the worker gave itself, which the report tells.
	acquired time.Time
}

// allowance is how long the worker gave itself for the scope.
func (s timerScope) allowance() time.Duration { return max(s.expires.Sub(s.acquired), 0) }

// reaping is what the expiry of a worker's scopes decides.
type reaping struct {
	pid int
	// expired are the worker's expired scopes, by expiry.
	expired []timerScope
	// cause is the first expired scope that asked for a signal, whose
	// signal the worker gets; with none (cause.signal 0) the worker is
	// not reaped, but its timers are cleared all the same, as torch does.
	cause timerScope
}

// expiredTimers decides, at now, which workers' scopes have expired and
// how each worker is reaped: torch's rule (get_expired_timers and
// _run_watchdog). The result is by pid.
func expiredTimers(scopes map[timerKey]timerScope, now time.Time) []reaping {
	byPid := make(map[int][]timerScope)
	for _, s := range scopes {
		if !s.expires.After(now) {
			byPid[s.pid] = append(byPid[s.pid], s)
		}
	}
	out := make([]reaping, 0, len(byPid))
	for pid, expired := range byPid {
		slices.SortFunc(expired, func(a, b timerScope) int {
			if c := a.expires.Compare(b.expires); c != 0 {
				return c
			}
			return strings.Compare(a.scope, b.scope)
		})
		r := reaping{pid: pid, expired: expired}
		if i := slices.IndexFunc(expired, func(s timerScope) bool { return s.signal > 0 }); i >= 0 {
			r.cause = expired[i]
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b reaping) int { return a.pid - b.pid })
	return out
}

// nextExpiry is the earliest expiry among scopes; false when there is none.
func nextExpiry(scopes map[timerKey]timerScope) (time.Time, bool) {
	var next time.Time
	for _, s := range scopes {
		if next.IsZero() || s.expires.Before(next) {
			next = s.expires
		}
	}
	return next, !next.IsZero()
}

// timerPipe is the watchdog's named pipe and the goroutine that reads it.
// The goroutine parses each line and sends the requests on requests; it
// exits when Close is called, which also removes the pipe.
type timerPipe struct {
	path     string
	f        *os.File
	requests chan timerRequest
	done     chan struct{} // closed by Close: stop sending
	exited   chan struct{} // closed by the reader when it returns
}

// openTimerPipe makes the named pipe at path and starts reading it. A
// named pipe already there (left by a killed agent) is made anew, as
// torch does; any other file is refused rather than removed.
func openTimerPipe(path string, log zerolog.Logger) (*timerPipe, error) {
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("elastic: %s: %w", timerFileEnv, err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != fs.ModeNamedPipe {
			return nil, fmt.Errorf("elastic: %s %s exists and is not a named pipe", timerFileEnv, path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("elastic: %s: %w", timerFileEnv, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("elastic: %s: %w", timerFileEnv, err)
	}
	// Only this user's workers may write to it.
	if err := unix.Mkfifo(path, 0o600); err != nil {
		return nil, fmt.Errorf("elastic: %s: make %s: %w", timerFileEnv, path, err)
	}
	// Read and write: the agent's own write end keeps the pipe open when
	// no client has it, so a read waits for the next line instead of
	// seeing end-of-file again and again, and clients, which open it
	// without blocking, always find a reader. The pipe is pollable, so
	// Close ends a pending read.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("elastic: %s: open %s: %w", timerFileEnv, path, err)
	}
	return newTimerPipe(path, f, log), nil
}

// openTimerPipeIn makes the named pipe name in the attempt's folder dir,
// through the folder's descriptor (launcher.LogDir.Mkfifo: never through
// a link), and starts reading it, as openTimerPipe does.
func openTimerPipeIn(dir *launcher.LogDir, name string, log zerolog.Logger) (*timerPipe, error) {
	f, err := dir.Mkfifo(name)
	if err != nil {
		return nil, fmt.Errorf("elastic: %s: %w", timerFileEnv, err)
	}
	path, err := filepath.Abs(f.Name())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("elastic: %s: %w", timerFileEnv, err)
	}
	return newTimerPipe(path, f, log), nil
}

// newTimerPipe starts reading f, the pipe at path, opened for reading
// and writing.
func newTimerPipe(path string, f *os.File, log zerolog.Logger) *timerPipe {
	p := &timerPipe{
		path:     path,
		f:        f,
		requests: make(chan timerRequest, 256),
		done:     make(chan struct{}),
		exited:   make(chan struct{}),
	}
	go p.read(&complaints{log: log})
	return p
}

// read sends every request line on p.requests until the pipe is closed.
// Lines longer than maxTimerLine are skipped whole, and lines that are
// not requests are logged, a few of them, and skipped.
func (p *timerPipe) read(bad *complaints) {
	defer close(p.exited)
	r := bufio.NewReaderSize(p.f, maxTimerLine)
	skipping := false // the rest of an overlong line
	for {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if !skipping {
				bad.warn().Int("bytes", len(line)).Msg("watchdog: skipping an overlong request line")
			}
			skipping = true
			continue
		}
		if err != nil {
			return // closed
		}
		if skipping {
			skipping = false
			continue
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		req, err := parseTimerRequest(line)
		if err != nil {
			bad.warn().Err(err).Msg("watchdog: skipping a request")
			continue
		}
		select {
		case p.requests <- req:
		case <-p.done:
			return
		}
	}
}

// Close stops the reader and removes the pipe. Clients that open it
// afterwards fail, as they do with torch when its server has stopped.
func (p *timerPipe) Close() error {
	close(p.done)
	err := p.f.Close()
	<-p.exited
	if rerr := os.Remove(p.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// complaints logs the first few bad inputs of a kind and then stops.
type complaints struct {
	log zerolog.Logger
	n   int
}

// warn is a warning event for the next complaint; nil, which logs
// nothing, once maxComplaints have been logged.
func (c *complaints) warn() *zerolog.Event {
	c.n++
	switch {
	case c.n < maxComplaints:
		return c.log.Warn()
	case c.n == maxComplaints:
		return c.log.Warn().Str("note", "further ones in this attempt are not logged")
	}
	return nil
}

// fileTimer serves the watchdog for the agent's watch loop, which owns
// it: it holds the scopes of the attempt's workers, keeps a timer at the
// next expiry, reaps the workers whose scopes expire, and tells their
// exits apart. A nil *fileTimer (the watchdog off) does nothing and its
// channels are nil.
type fileTimer struct {
	pipe   *timerPipe
	now    func() time.Time
	log    zerolog.Logger
	signal func(slot int, sig syscall.Signal) error
	slots  map[int]workerSlot // by pid, of the live workers
	scopes map[timerKey]timerScope
	reaped map[int]reapedScope // by slot
	timer  *time.Timer
	bad    complaints
	// askStacks: the workers are Python with faulthandler on, so a worker
	// to be SIGKILLed gets SIGABRT first, on which faulthandler prints
	// every thread's traceback (and re-raises it); SIGKILL follows after
	// stacksGrace in case it is still alive.
	askStacks   bool
	stacksGrace time.Duration
}

// stacksGrace is how long a worker asked for its stacks has to print them
// before SIGKILL.
const stacksGrace = 2 * time.Second

// workerSlot is a live worker as the watchdog knows it.
type workerSlot struct{ slot, rank int }

// reapedScope is the scope whose expiry signalled a worker, and when.
type reapedScope struct {
	timerScope
	at time.Time
	// stacks: the worker was asked for its stacks (SIGABRT) first.
	stacks bool
}

// newFileTimer serves pipe for the workers whose pids are given by slot,
// rank base+slot; signal sends a signal to one of them.
func newFileTimer(pipe *timerPipe, pids []int, base int, now func() time.Time, signal func(slot int, sig syscall.Signal) error, log zerolog.Logger) *fileTimer {
	t := &fileTimer{
		pipe:   pipe,
		now:    now,
		log:    log,
		signal: signal,
		slots:  make(map[int]workerSlot, len(pids)),
		scopes: make(map[timerKey]timerScope),
		reaped: make(map[int]reapedScope),
		timer:  time.NewTimer(time.Hour),
		bad:    complaints{log: log},
	}
	t.timer.Stop()
	for slot, pid := range pids {
		t.slots[pid] = workerSlot{slot: slot, rank: base + slot}
	}
	return t
}

// startFileTimer serves the watchdog for att when it has a pipe.
func (a *Agent) startFileTimer(att *attempt) *fileTimer {
	if att.timerPipe == nil {
		return nil
	}
	t := newFileTimer(att.timerPipe, att.group.Pids(), att.baseRank, a.now, att.group.SignalWorker, a.log)
	t.askStacks, t.stacksGrace = att.faultHandler, stacksGrace
	return t
}

// requests delivers the requests the workers write.
func (t *fileTimer) requests() <-chan timerRequest {
	if t == nil {
		return nil
	}
	return t.pipe.requests
}

// due fires when a scope may have expired.
func (t *fileTimer) due() <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.timer.C
}

// handle applies a request of a live worker; requests in other pids'
// names are ignored: a worker may not have the agent signal a process
// that is not one of its workers.
func (t *fileTimer) handle(r timerRequest) {
	w, ok := t.slots[r.pid]
	switch {
	case !ok:
		t.bad.warn().Int("pid", r.pid).Str("scope", r.scope).Msg("watchdog: ignoring a request for a process that is not one of this node's live workers")
		return
	case r.release:
		delete(t.scopes, r.timerKey)
	default:
		if _, held := t.scopes[r.timerKey]; !held && len(t.scopes) >= maxTimerScopes {
			t.bad.warn().Int("rank", w.rank).Str("scope", r.scope).Int("held", len(t.scopes)).Msg("watchdog: too many scopes held; ignoring a new one")
			return
		}
		t.scopes[r.timerKey] = timerScope{timerKey: r.timerKey, expires: r.expires, signal: r.signal, acquired: t.now()}
	}
	t.arm()
}

// check reaps the workers whose scopes have expired.
func (t *fileTimer) check() {
	now := t.now()
	for _, r := range expiredTimers(t.scopes, now) {
		for key := range t.scopes {
			if key.pid == r.pid {
				delete(t.scopes, key)
			}
		}
		w := t.slots[r.pid]
		if r.cause.signal == 0 {
			t.log.Warn().Int("rank", w.rank).Int("pid", r.pid).Str("scope", r.expired[0].scope).
				Msg("watchdog: scope expired; it asked for no signal, so the worker goes on")
			continue
		}
		sig, stacks := r.cause.signal, t.askStacks && r.cause.signal == syscall.SIGKILL
		if stacks {
			// SIGKILL leaves no trace of where the worker was stuck; the
			// traceback faulthandler prints on SIGABRT does.
			sig = syscall.SIGABRT
			slot := w.slot
			time.AfterFunc(t.stacksGrace, func() { _ = t.signal(slot, syscall.SIGKILL) })
		}
		t.log.Error().Int("rank", w.rank).Int("pid", r.pid).Str("scope", r.cause.scope).
			Str("after", roundIdle(r.cause.allowance()).String()).Str("signal", signalName(sig)).
			Bool("stacks", stacks).Msg("watchdog: scope expired; signalling the worker")
		if err := t.signal(w.slot, sig); err != nil {
			t.log.Warn().Err(err).Int("rank", w.rank).Msg("watchdog: signalling a worker")
			continue
		}
		if _, ok := t.reaped[w.slot]; !ok {
			t.reaped[w.slot] = reapedScope{timerScope: r.cause, at: now, stacks: stacks}
		}
	}
	t.arm()
}

// arm sets the timer to the next expiry, at most timerRecheck away.
func (t *fileTimer) arm() {
	next, ok := nextExpiry(t.scopes)
	if !ok {
		t.timer.Stop()
		return
	}
	t.timer.Reset(min(max(next.Sub(t.now()), 0), timerRecheck))
}

// exited forgets the worker of slot, which has exited, and its scopes,
// and returns the scope that reaped it, if one did.
func (t *fileTimer) exited(slot int) (reapedScope, bool) {
	if t == nil {
		return reapedScope{}, false
	}
	for pid, w := range t.slots {
		if w.slot == slot {
			delete(t.slots, pid)
			for key := range t.scopes {
				if key.pid == pid {
					delete(t.scopes, key)
				}
			}
		}
	}
	t.arm()
	s, ok := t.reaped[slot]
	return s, ok
}

// failure is f, the failed exit of a worker that scope s reaped, told as
// the watchdog's doing: its message names the scope (what the worker's
// error file said moves to the traceback) and it dates from the reaping.
func (s reapedScope) failure(f Failure) Failure {
	msg := fmt.Sprintf("watchdog: scope %q expired after %s", s.scope, roundIdle(s.allowance()))
	if s.stacks {
		msg += "; asked for its Python stacks (SIGABRT, printed above), then SIGKILL"
	}
	info := &launcher.ErrorInfo{Message: msg, Timestamp: s.at}
	if f.Error != nil {
		info.Traceback = joinLines(f.Error.Message, f.Error.Traceback)
	}
	f.Error = info
	return f
}

// stop releases the timer; the pipe is the attempt's to close.
func (t *fileTimer) stop() {
	if t != nil {
		t.timer.Stop()
	}
}

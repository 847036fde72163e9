package elastic

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestParseTimerRequest(t *testing.T) {
	at := func(s float64) time.Time { return unixSeconds(s) }
	for _, tc := range []struct {
		line string
		want timerRequest
		bad  bool
	}{
		// What torch's FileTimerClient writes, 1.13 and 2.x alike.
		{line: `{"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": 1700000000.5, "signal": 9}`,
			want: timerRequest{timerKey: timerKey{4242, "train_step"}, expires: time.Unix(1700000000, 5e8), signal: syscall.SIGKILL}},
		{line: `{"version": 1, "pid": 4242, "scope_id": "train_step", "expiration_time": -1, "signal": 0}`,
			want: timerRequest{timerKey: timerKey{4242, "train_step"}, release: true}},
		{line: `{"pid": 7, "scope_id": "", "expiration_time": 0, "signal": 15}`,
			want: timerRequest{timerKey: timerKey{7, ""}, expires: time.Unix(0, 0), signal: syscall.SIGTERM}},
		// A signal <= 0 asks for no reaping.
		{line: `{"pid": 7, "scope_id": "s", "expiration_time": 5, "signal": -3}`,
			want: timerRequest{timerKey: timerKey{7, "s"}, expires: at(5)}},
		// Times past any calendar mean never, not an overflow.
		{line: `{"pid": 7, "scope_id": "s", "expiration_time": 1e300, "signal": 9}`,
			want: timerRequest{timerKey: timerKey{7, "s"}, expires: at(neverSeconds), signal: syscall.SIGKILL}},
		{line: `{"pid": 7, "scope_id": "s", "expiration_time": NaN, "signal": 9}`, bad: true},
		{line: `{"pid": 7, "scope_id": "s", "expiration_time": Infinity, "signal": 9}`, bad: true},
		{line: `{"pid": 0, "scope_id": "s", "expiration_time": 5, "signal": 9}`, bad: true},
		{line: `{"pid": -1, "scope_id": "s", "expiration_time": 5, "signal": 9}`, bad: true},
		{line: `{"pid": 1.5, "scope_id": "s", "expiration_time": 5, "signal": 9}`, bad: true},
		{line: `{"pid": 99999999999999999999, "scope_id": "s", "expiration_time": 5, "signal": 9}`, bad: true},
		{line: `{"pid": 7, "scope_id": "s", "expiration_time": 5, "signal": 65}`, bad: true},
		{line: `{"pid": 7, "scope_id": "s", "expiration_time": 5}`, bad: true},
		{line: `{"pid": 7, "expiration_time": 5, "signal": 9}`, bad: true},
		{line: `{"pid": "7", "scope_id": "s", "expiration_time": 5, "signal": 9}`, bad: true},
		{line: `[1, 2, 3]`, bad: true},
		{line: `garbage`, bad: true},
		{line: ``, bad: true},
	} {
		got, err := parseTimerRequest([]byte(tc.line))
		switch {
		case tc.bad && !errors.Is(err, errBadTimerRequest):
			t.Errorf("%s: got %+v, %v; want errBadTimerRequest", tc.line, got, err)
		case !tc.bad && (err != nil || got.timerKey != tc.want.timerKey || !got.expires.Equal(tc.want.expires) ||
			got.release != tc.want.release || got.signal != tc.want.signal):
			t.Errorf("%s: got %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}

func TestExpiredTimers(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	scope := func(pid int, name string, expiresIn time.Duration, sig syscall.Signal) timerScope {
		return timerScope{timerKey: timerKey{pid, name}, expires: t0.Add(expiresIn), signal: sig, acquired: t0.Add(-time.Second)}
	}
	// want is, per reaped pid, its expired scopes by expiry and the
	// scope whose signal it gets ("" for none).
	type want struct {
		pid     int
		expired []string
		cause   string
	}
	for _, tc := range []struct {
		name   string
		scopes []timerScope
		want   []want
	}{
		{"nothing held", nil, nil},
		{"not yet", []timerScope{scope(1, "a", time.Nanosecond, 9)}, nil},
		{"expires at now", []timerScope{scope(1, "a", 0, 9)},
			[]want{{1, []string{"a"}, "a"}}},
		{"only the expired scopes of a pid", []timerScope{scope(1, "a", -time.Second, 9), scope(1, "b", time.Second, 9)},
			[]want{{1, []string{"a"}, "a"}}},
		{"the first by expiry with a signal reaps", []timerScope{
			scope(1, "late", -time.Second, syscall.SIGTERM), scope(1, "early", -2*time.Second, 0), scope(1, "mid", -1500*time.Millisecond, syscall.SIGKILL),
		}, []want{{1, []string{"early", "mid", "late"}, "mid"}}},
		{"no signal asked, no cause", []timerScope{scope(1, "a", -time.Second, 0)},
			[]want{{1, []string{"a"}, ""}}},
		{"workers apart, by pid", []timerScope{
			scope(30, "x", -time.Second, 9), scope(10, "y", -time.Minute, 15), scope(20, "z", time.Minute, 9),
		}, []want{{10, []string{"y"}, "y"}, {30, []string{"x"}, "x"}}},
		{"same expiry, by scope name", []timerScope{scope(1, "b", 0, 9), scope(1, "a", 0, 9)},
			[]want{{1, []string{"a", "b"}, "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scopes := make(map[timerKey]timerScope)
			for _, s := range tc.scopes {
				scopes[s.timerKey] = s
			}
			var got []want
			for _, r := range expiredTimers(scopes, t0) {
				w := want{pid: r.pid, cause: r.cause.scope}
				for _, s := range r.expired {
					w.expired = append(w.expired, s.scope)
				}
				got = append(got, w)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if len(scopes) != len(tc.scopes) {
				t.Errorf("expiredTimers changed the scopes it was given")
			}
		})
	}
}

// timerServer is a fileTimer serving a real pipe for two make-believe
// workers, pids 1001 (slot 0, rank 10) and 1002 (slot 1, rank 11), with a
// fake clock; the signals it sends are recorded, not sent.
type timerServer struct {
	*fileTimer
	clock *fakeClock
	path  string
	mu    sync.Mutex
	sent  []string // "slot:signal"
}

// signals are the signals sent so far.
func (s *timerServer) signals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}

func newTimerServer(t *testing.T) *timerServer {
	t.Helper()
	path := filepath.Join(t.TempDir(), timerFileName)
	pipe, err := openTimerPipe(path, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pipe.Close() })
	s := &timerServer{clock: &fakeClock{t: time.Unix(1_700_000_000, 0)}, path: path}
	s.fileTimer = newFileTimer(pipe, []int{1001, 1002}, 10, s.clock.now, func(slot int, sig syscall.Signal) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sent = append(s.sent, fmt.Sprintf("%d:%s", slot, signalName(sig)))
		return nil
	}, zerolog.New(zerolog.NewTestWriter(t)))
	t.Cleanup(s.fileTimer.stop)
	return s
}

// send writes line as torch's FileTimerClient does: it opens the pipe
// without blocking (failing when no one reads it), writes and closes.
func (s *timerServer) send(t *testing.T, line string) {
	t.Helper()
	f, err := os.OpenFile(s.path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatalf("open the pipe as a client: %v", err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatalf("write a request: %v", err)
	}
}

// acquire is a request of pid for scope, expiring after d by the fake
// clock.
func (s *timerServer) acquire(pid int, scope string, d time.Duration, sig syscall.Signal) string {
	exp := float64(s.clock.now().Add(d).UnixNano()) / 1e9
	return fmt.Sprintf(`{"version": 1, "pid": %d, "scope_id": %q, "expiration_time": %f, "signal": %d}`, pid, scope, exp, sig)
}

func release(pid int, scope string) string {
	return fmt.Sprintf(`{"version": 1, "pid": %d, "scope_id": %q, "expiration_time": -1, "signal": 0}`, pid, scope)
}

// receive handles the next request that reaches the server; it fails the
// test if none comes within 5 s.
func (s *timerServer) receive(t *testing.T) timerRequest {
	t.Helper()
	select {
	case r := <-s.requests():
		s.handle(r)
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the server")
		return timerRequest{}
	}
}

func TestFileTimerReapsTheWorkerThatOverstays(t *testing.T) {
	s := newTimerServer(t)
	s.send(t, s.acquire(1001, "train_step", time.Second, syscall.SIGKILL))
	s.send(t, s.acquire(1002, "train_step", time.Second, syscall.SIGTERM))
	s.send(t, release(1002, "train_step"))
	for range 3 {
		s.receive(t)
	}
	s.clock.advance(999 * time.Millisecond)
	s.check()
	if len(s.signals()) != 0 {
		t.Fatalf("signalled before the expiry: %v", s.signals())
	}
	s.clock.advance(time.Millisecond)
	s.check()
	if want := []string{"0:SIGKILL"}; !slices.Equal(s.signals(), want) {
		t.Fatalf("signals %v, want %v (the released scope reaps nothing)", s.signals(), want)
	}
	// A reaped worker's timers are cleared: it is not signalled again.
	s.clock.advance(time.Minute)
	s.check()
	if len(s.signals()) != 1 {
		t.Fatalf("signalled again: %v", s.signals())
	}

	reaped, ok := s.exited(0)
	if !ok {
		t.Fatal("the reaped worker's exit is not the watchdog's")
	}
	if _, ok := s.exited(1); ok {
		t.Error("a worker the watchdog spared exited as reaped")
	}
	f := reaped.failure(Failure{})
	if want := `watchdog: scope "train_step" expired after 1s`; f.Error == nil || f.Error.Message != want {
		t.Errorf("failure %+v, want message %q", f.Error, want)
	}
	if !f.When().Equal(time.Unix(1_700_000_001, 0)) {
		t.Errorf("failure dated %v, want the reaping's time", f.When())
	}
}

// Hostile or broken clients: garbage, overlong lines, requests in the name
// of processes that are not the agent's workers. None is acted on, none
// stops the server, and the requests after them still arrive.
func TestFileTimerShrugsOffBadRequests(t *testing.T) {
	s := newTimerServer(t)
	s.send(t, "garbage")
	s.send(t, `{"pid": 1001, "scope_id": "nan", "expiration_time": NaN, "signal": 9}`)
	s.send(t, `{"pid": -1, "scope_id": "everyone", "expiration_time": 0, "signal": 9}`)
	// More than the pipe holds, from a client that blocks, without a
	// newline until the end.
	huge := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(s.path, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(`{"pid": 1001, "scope_id": "` + strings.Repeat("x", 4*maxTimerLine) + `", "expiration_time": 0, "signal": 9}` + "\n")
			f.Close()
		}
		huge <- err
	}()
	if err := <-huge; err != nil {
		t.Fatal(err)
	}
	s.send(t, s.acquire(4242, "stranger", 0, syscall.SIGKILL)) // not a worker
	s.send(t, s.acquire(1002, "last", time.Second, syscall.SIGKILL))

	if r := s.receive(t); r.pid != 4242 {
		t.Fatalf("first request to arrive %+v, want the stranger's: the bad ones must be skipped", r)
	}
	if r := s.receive(t); r.pid != 1002 || r.scope != "last" {
		t.Fatalf("second request to arrive %+v, want rank 11's", r)
	}
	s.clock.advance(time.Hour)
	s.check()
	if want := []string{"1:SIGKILL"}; !slices.Equal(s.signals(), want) {
		t.Fatalf("signals %v, want only %v", s.signals(), want)
	}
}

// The timer fires once a held scope is due, by the injected clock.
func TestFileTimerIsDueAtTheExpiry(t *testing.T) {
	s := newTimerServer(t)
	select {
	case <-s.due():
		t.Fatal("due with no scope held")
	default:
	}
	s.send(t, s.acquire(1001, "a", time.Hour, syscall.SIGKILL))
	s.receive(t)
	s.clock.advance(time.Hour)
	s.send(t, s.acquire(1002, "b", time.Hour, syscall.SIGKILL)) // rearms
	s.receive(t)
	select {
	case <-s.due():
	case <-time.After(5 * time.Second):
		t.Fatal("an expired scope did not make the timer due")
	}
	s.check()
	if want := []string{"0:SIGKILL"}; !slices.Equal(s.signals(), want) {
		t.Fatalf("signals %v, want %v", s.signals(), want)
	}
	// Rank 10's scopes went with its reaping; rank 11's go with its exit.
	s.exited(1)
	if _, ok := nextExpiry(s.scopes); ok {
		t.Errorf("scopes of an exited worker are kept: %v", s.scopes)
	}
}

func TestFileTimerBoundsTheScopesHeld(t *testing.T) {
	s := newTimerServer(t)
	for i := range maxTimerScopes + 5 {
		s.handle(timerRequest{timerKey: timerKey{1001, fmt.Sprint(i)}, expires: s.clock.now().Add(time.Hour), signal: syscall.SIGKILL})
	}
	if len(s.scopes) != maxTimerScopes {
		t.Fatalf("%d scopes held, want at most %d", len(s.scopes), maxTimerScopes)
	}
	// A scope already held may still be renewed.
	s.handle(timerRequest{timerKey: timerKey{1001, "0"}, expires: s.clock.now().Add(2 * time.Hour), signal: syscall.SIGKILL})
	if got := s.scopes[timerKey{1001, "0"}].expires; !got.Equal(s.clock.now().Add(2 * time.Hour)) {
		t.Errorf("renewed scope expires %v", got)
	}
}

func TestTimerPipeLifecycle(t *testing.T) {
	dir := t.TempDir()
	log := zerolog.New(zerolog.NewTestWriter(t))

	// Someone else's file is never removed.
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := openTimerPipe(regular, log); err == nil {
		p.Close()
		t.Fatal("a regular file was taken for the pipe")
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep" {
		t.Fatalf("the regular file was touched: %q, %v", b, err)
	}

	// A pipe left behind is made anew; Close removes it, and a client
	// then fails at once instead of blocking.
	path := filepath.Join(dir, "sub", "pipe")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := openTimerPipe(path, log)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err != nil {
		t.Fatalf("a client cannot open the served pipe: %v", err)
	} else {
		f.Close()
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pipe outlived Close: %v", err)
	}

	// A pipe that was open but never removed (a killed agent) answers
	// no client: that is torch's "server not available".
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("a client of an unserved pipe: %v, want ENXIO", err)
	}
}

// Python workers with faulthandler on are asked for their stacks before
// a SIGKILL: SIGABRT first, SIGKILL after the grace; a catchable signal a
// client asked for is sent as it is.
func TestFileTimerAsksPythonForStacks(t *testing.T) {
	s := newTimerServer(t)
	s.askStacks, s.stacksGrace = true, 10*time.Millisecond
	s.send(t, s.acquire(1001, "train_step", time.Second, syscall.SIGKILL))
	s.send(t, s.acquire(1002, "train_step", time.Second, syscall.SIGTERM))
	s.receive(t)
	s.receive(t)
	s.clock.advance(time.Second)
	s.check()
	deadline := time.Now().Add(5 * time.Second)
	for len(s.signals()) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	got := s.signals()
	slices.Sort(got)
	if want := []string{"0:SIGABRT", "0:SIGKILL", "1:SIGTERM"}; !slices.Equal(got, want) {
		t.Fatalf("signals %v, want %v", got, want)
	}
	reaped, _ := s.exited(0)
	if f := reaped.failure(Failure{}); !strings.Contains(f.Error.Message, "asked for its Python stacks") {
		t.Errorf("failure %q does not say the stacks were asked for", f.Error.Message)
	}
	if reaped, _ := s.exited(1); strings.Contains(reaped.failure(Failure{}).Error.Message, "stacks") {
		t.Error("a worker sent its own signal is said to have been asked for stacks")
	}
}

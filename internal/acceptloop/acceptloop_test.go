package acceptloop

import (
	"errors"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

func TestNextPause(t *testing.T) {
	for _, tc := range []struct{ last, want time.Duration }{
		{0, 5 * time.Millisecond},
		{time.Millisecond, 5 * time.Millisecond},
		{5 * time.Millisecond, 10 * time.Millisecond},
		{320 * time.Millisecond, 640 * time.Millisecond},
		{640 * time.Millisecond, time.Second},
		{time.Second, time.Second},
	} {
		if got := NextPause(tc.last); got != tc.want {
			t.Errorf("NextPause(%v) = %v, want %v", tc.last, got, tc.want)
		}
	}
}

// scripted is a listener whose Accept returns its script's results in
// turn, noting when each was asked for, then blocks until Close.
type scripted struct {
	start  time.Time
	script []result
	closed chan struct{}

	mu    sync.Mutex
	calls []time.Duration // since start
	once  sync.Once
}

type result struct {
	conn net.Conn
	err  error
}

func newScripted(script ...result) *scripted {
	return &scripted{start: time.Now(), script: script, closed: make(chan struct{})}
}

func (l *scripted) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls = append(l.calls, time.Since(l.start))
	i := len(l.calls) - 1
	l.mu.Unlock()
	if i < len(l.script) {
		return l.script[i].conn, l.script[i].err
	}
	<-l.closed
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
}

func (l *scripted) Close() error   { l.once.Do(func() { close(l.closed) }); return nil }
func (l *scripted) Addr() net.Addr { return &net.TCPAddr{} }

func (l *scripted) callTimes() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Duration(nil), l.calls...)
}

var emfile = &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}

func pipeConn(t *testing.T) net.Conn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

// A run of errors pauses 5 ms, then 10 ms; a connection resets the
// pause; closing the listener ends Serve with its error.
func TestServeBacksOffAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c1, c2 := pipeConn(t), pipeConn(t)
		l := newScripted(result{err: emfile}, result{err: emfile}, result{conn: c1}, result{err: emfile}, result{conn: c2})
		var handled []net.Conn
		var handledAt []time.Duration
		served := make(chan error, 1)
		go func() {
			served <- Serve(l, make(chan struct{}), zerolog.Nop(), func(c net.Conn) bool {
				handled = append(handled, c)
				handledAt = append(handledAt, time.Since(l.start))
				return true
			})
		}()
		time.Sleep(time.Second) // the script has long run out
		synctest.Wait()
		ms := time.Millisecond
		want := []time.Duration{0, 5 * ms, 15 * ms, 15 * ms, 20 * ms, 20 * ms}
		if got := l.callTimes(); !slices.Equal(got, want) {
			t.Errorf("accepts at %v, want %v", got, want)
		}
		if len(handled) != 2 || handled[0] != c1 || handled[1] != c2 || !slices.Equal(handledAt, []time.Duration{15 * ms, 20 * ms}) {
			t.Errorf("handled %v at %v, want c1 and c2 at 15ms and 20ms", handled, handledAt)
		}
		l.Close()
		if err := <-served; !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve after Close = %v, want net.ErrClosed", err)
		}
	})
}

// Errors that go on pause at most a second between tries.
func TestServePauseIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		script := make([]result, 12)
		for i := range script {
			script[i].err = emfile
		}
		l := newScripted(script...)
		done := make(chan struct{})
		served := make(chan error, 1)
		go func() {
			served <- Serve(l, done, zerolog.Nop(), func(net.Conn) bool { t.Error("no connection was offered"); return true })
		}()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		calls := l.callTimes()
		if len(calls) != len(script)+1 {
			t.Fatalf("%d accepts, want %d", len(calls), len(script)+1)
		}
		var gaps []time.Duration
		for i := 1; i < len(calls); i++ {
			gaps = append(gaps, calls[i]-calls[i-1])
		}
		ms := time.Millisecond
		want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second, time.Second, time.Second}
		if !slices.Equal(gaps, want) {
			t.Errorf("pauses %v, want %v", gaps, want)
		}
		close(done)
		l.Close()
		if err := <-served; err != nil {
			t.Errorf("Serve after done = %v, want nil", err)
		}
	})
}

// Closing done ends a pause at once, without another Accept.
func TestServeDoneCutsThePause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newScripted(result{err: emfile}, result{err: emfile}, result{err: emfile})
		done := make(chan struct{})
		served := make(chan error, 1)
		go func() {
			served <- Serve(l, done, zerolog.Nop(), func(net.Conn) bool { return true })
		}()
		time.Sleep(7 * time.Millisecond) // in the second pause, of 10 ms
		close(done)
		if err := <-served; err != nil {
			t.Errorf("Serve = %v, want nil", err)
		}
		if got := time.Since(l.start); got != 7*time.Millisecond {
			t.Errorf("Serve returned after %v, want at once (7ms)", got)
		}
		if n := len(l.callTimes()); n != 2 {
			t.Errorf("%d accepts, want 2", n)
		}
	})
}

// An error with done closed is the owner stopping: nil, not the error.
func TestServeErrorAfterDoneIsNil(t *testing.T) {
	l := newScripted(result{err: emfile})
	done := make(chan struct{})
	close(done)
	if err := Serve(l, done, zerolog.Nop(), func(net.Conn) bool { return true }); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
}

// A handler that refuses a connection ends the loop.
func TestServeHandlerStops(t *testing.T) {
	c := pipeConn(t)
	l := newScripted(result{conn: c}, result{err: emfile})
	if err := Serve(l, make(chan struct{}), zerolog.Nop(), func(net.Conn) bool { return false }); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
	if n := len(l.callTimes()); n != 1 {
		t.Errorf("%d accepts, want 1", n)
	}
}

// A real listener closed under Serve: the error, at once.
func TestServeClosedListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		served <- Serve(ln, make(chan struct{}), zerolog.Nop(), func(c net.Conn) bool { c.Close(); return true })
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	ln.Close()
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve = %v, want net.ErrClosed", err)
	}
}

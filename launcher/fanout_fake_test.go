package launcher

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// fakeNet is a cluster of in-process hosts for Fanout: dialing one takes
// setup, a leaf agent prints a line and exits with its host's status (or
// waits to be stopped), and a relay (its argv ends in --ssh-relay) runs
// the RelayPlan it gets on stdin with a Fanout of its own over the same
// fakeNet, in this process.
type fakeNet struct {
	setup time.Duration
	// codes are the leaf agents' statuses by host (absent = 0).
	codes map[string]int
	// hold makes leaf agents whose status is 0 run until stopped.
	hold bool
	// relayGrace, when set, is the relays' FailureGrace.
	relayGrace time.Duration
	// drops[host] dials of host fail as a MaxStartups drop before one works.
	drops map[string]int

	mu      sync.Mutex
	dropped map[string]int
	started atomic.Int64  // leaf agents started
	stopped atomic.Int64  // leaf agents stopped by EOF or signal
	allUp   chan struct{} // closed when started reaches want
	want    int64
}

func newFakeNet(want int) *fakeNet {
	return &fakeNet{codes: map[string]int{}, drops: map[string]int{}, dropped: map[string]int{}, allUp: make(chan struct{}), want: int64(want)}
}

// fakeDialer is one launcher's dialer: it counts the connections that
// launcher holds.
type fakeDialer struct {
	net                 *fakeNet
	open, max           atomic.Int64 // connections held
	dialing, maxDialing atomic.Int64 // connections being set up
	dials               atomic.Int64
}

func raise(max *atomic.Int64, n int64) {
	for {
		m := max.Load()
		if n <= m || max.CompareAndSwap(m, n) {
			return
		}
	}
}

func (d *fakeDialer) Dial(ctx context.Context, host string) (Conn, error) {
	d.dials.Add(1)
	raise(&d.maxDialing, d.dialing.Add(1))
	defer d.dialing.Add(-1)
	if d.net.setup > 0 {
		t := time.NewTimer(d.net.setup)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	d.net.mu.Lock()
	drop := d.net.dropped[host] < d.net.drops[host]
	if drop {
		d.net.dropped[host]++
	}
	d.net.mu.Unlock()
	if drop {
		return nil, &SSHError{Host: host, Op: "handshake", Err: fmt.Errorf("ssh: handshake failed: %w", io.EOF)}
	}
	raise(&d.max, d.open.Add(1))
	return &fakeConn{d: d, host: host}, nil
}

type fakeConn struct {
	d      *fakeDialer // nil for a relay's own host
	net    *fakeNet
	host   string
	closed atomic.Bool
}

func (c *fakeConn) Host() string     { return c.host }
func (c *fakeConn) HostName() string { return c.host }
func (c *fakeConn) Output(context.Context, []string, string, io.Reader) ([]byte, error) {
	return []byte("127.0.0.1 1 127.0.0.1 22\n"), nil
}

func (c *fakeConn) Close() error {
	if c.d != nil && !c.closed.Swap(true) {
		c.d.open.Add(-1)
	}
	return nil
}

func (c *fakeConn) fnet() *fakeNet {
	if c.d != nil {
		return c.d.net
	}
	return c.net
}

func (c *fakeConn) Start(ctx context.Context, dir string, env, argv []string, stdin []byte, stdout, stderr io.Writer) (Process, error) {
	n := c.fnet()
	p := &fakeProc{done: make(chan struct{}), stop: make(chan struct{})}
	if argv[len(argv)-1] == "--ssh-relay" {
		plan, err := decodeRelayPlan(stdin)
		if err != nil {
			return nil, err
		}
		f := plan.Fanout()
		f.Dialer = &fakeDialer{net: n}
		f.Local = &fakeConn{net: n, host: plan.Self.Host}
		f.Stdout, f.Stderr, f.Logger = stdout, stderr, zerolog.Nop()
		if n.relayGrace > 0 {
			f.FailureGrace = n.relayGrace
		}
		signals := make(chan os.Signal, 1)
		f.Signals = signals
		p.relay = signals
		go func() {
			code, err := f.Run(context.Background())
			if err != nil {
				fmt.Fprintf(stderr, "gorun: %v\n", err)
				code = 69
			}
			p.end(code)
		}()
		return p, nil
	}
	fmt.Fprintf(stdout, "%s: %s\n", c.host, argv[len(argv)-1])
	if n.started.Add(1) == n.want {
		close(n.allUp)
	}
	if n.hold && n.codes[c.host] == 0 {
		go func() {
			<-p.stop
			n.stopped.Add(1)
			p.end(128 + int(syscall.SIGTERM))
		}()
		return p, nil
	}
	p.end(n.codes[c.host])
	return p, nil
}

// fakeProc is a fake agent or relay.
type fakeProc struct {
	done     chan struct{}
	code     int
	stop     chan struct{}
	stopOnce sync.Once
	relay    chan os.Signal // a relay's Fanout's signals
}

func (p *fakeProc) end(code int) {
	p.code = code
	close(p.done)
}

func (p *fakeProc) Wait() (int, error)    { <-p.done; return p.code, nil }
func (p *fakeProc) Done() <-chan struct{} { return p.done }

// CloseStdin and Signal are one stop request, as gorun's stopOnStdinEOF
// makes them.
func (p *fakeProc) CloseStdin() error {
	p.stopOnce.Do(func() {
		close(p.stop)
		if p.relay != nil {
			p.relay <- syscall.SIGTERM
		}
	})
	return nil
}

func (p *fakeProc) Signal(syscall.Signal) error { return p.CloseStdin() }
func (p *fakeProc) Close()                      { p.CloseStdin() }

// fakeAgents are n agents on hosts h0, h1...: each prints its host and
// its last argument, its rank.
func fakeAgents(n int) []RemoteAgent {
	agents := make([]RemoteAgent, n)
	for i := range agents {
		agents[i] = RemoteAgent{
			Host:  fmt.Sprintf("h%d", i),
			Argv:  []string{"gorun", "--nnodes", fmt.Sprint(n), "--rdzv-endpoint", "", "--node-rank", fmt.Sprint(i)},
			Stdin: []byte("secret\n"), EndpointArg: 4,
		}
	}
	return agents
}

// lockedBuffer is an io.Writer for the head's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *lockedBuffer) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Split(strings.TrimSuffix(string(w.b), "\n"), "\n")
}

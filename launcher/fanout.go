package launcher

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// RemoteAgent is what a Fanout runs on one host.
type RemoteAgent struct {
	// Host is the SSH target, "[user@]name[:port]" (see DialSSH).
	Host string
	// Argv is the remote agent's command line; Argv[0] should be an
	// absolute path (the remote login shell's PATH may differ).
	Argv []string
	// Env is added to the remote command's environment (NAME=value).
	Env []string
	// EndpointArg, when positive, is the index in Argv of the argument
	// that Run sets to the job's rendezvous endpoint (see Fanout.Endpoint)
	// once every host is connected.
	EndpointArg int
	// Stdin is written to the agent's stdin before anything else (the
	// job's secret: no argv or environment of any process shows it); the
	// pipe then stays open, as the stdin contract of SSHProcess says.
	Stdin []byte
}

// Fanout is the head of a multi-node job: it starts one remote agent per
// host over SSH, streams their output and returns the job's exit status.
//
// Exit status: every remote agent of a c10d job exits with the job's root
// cause's status, so the head exits with the first non-zero status a remote
// agent reports, in the order they end, or 0 when all succeed. Status 1 is
// also what an agent exits with when gorun itself failed (an agent that lost
// the rendezvous store while reading the job's failures, or a lost SSH
// connection, which counts as 1 and is reported naming the host), so a 1 is
// replaced by a later agent's other non-zero status. After a signal the head
// exits 128+signal. It waits for every agent (after a failure, FailureGrace
// at most before stopping the rest).
type Fanout struct {
	Agents []RemoteAgent
	// Dir is the remote working directory ("" = the login directory).
	Dir    string
	SSH    SSHConfig
	Stdout io.Writer // remote stdout, whole lines at a time
	Stderr io.Writer // remote stderr, and the head's own messages
	// Signals stop the job: every remote agent's stdin is closed and it
	// is sent SIGTERM; the head then waits up to StopTimeout for them.
	Signals <-chan os.Signal
	// StopTimeout bounds the wait for the remote agents after a signal or
	// a failure (0 = 35 s).
	StopTimeout time.Duration
	// FailureGrace is how long the other agents get to end on their own
	// after one agent failed, before they are stopped (0 = 2 min: a c10d
	// job's agents need the exit barrier and their workers' shutdown).
	FailureGrace time.Duration
	// Stage, when set, is copied to every host that lacks it (see
	// stageBinary), at StageTo or in the host's cache folder, and
	// becomes each agent's Argv[0].
	Stage   *Binary
	StageTo string
	// Endpoint is the rendezvous endpoint, HOST:PORT, that agents get at
	// their EndpointArg. "" = the first agent's host, which then hosts the
	// store, at EndpointPort (0 = 29400), by the address on which its sshd
	// took the connection rather than by the host string (maybe an
	// ssh_config alias) or its HostName (the head's view); the HostName
	// only when that address is loopback or unknown (see
	// rendezvousEndpoint).
	Endpoint     string
	EndpointPort int
	Logger       zerolog.Logger

	// FanOut bounds the SSH connections this launcher opens: at most
	// FanOut hosts are being dialed at any time, and a tree launch holds
	// at most FanOut connections (0 = DefaultFanOut).
	FanOut int
	// NoTree launches every host from here however many there are: FanOut
	// then bounds the connections being set up at once, not those held.
	NoTree bool
	// Relay is the command line that runs a relay of a tree launch on a
	// host (gorun --ssh-relay, which reads its RelayPlan on stdin); an
	// empty Relay makes every launch flat. A staged binary replaces its
	// first word.
	Relay []string
	// Retries is how many more times a host is dialed whose sshd dropped
	// the connection during set-up (see retryDial), after a wait that
	// starts at RetryBackoff (0 = 250 ms), doubles, and is jittered.
	Retries      int
	RetryBackoff time.Duration
	// Dialer reaches the hosts (nil = SSH with the settings of SSH).
	Dialer Dialer
	// Self, on a relay, is the agent of the relay's own host, which Local
	// runs (nil = a child process of this one, its environment
	// SelfEnviron, then Self.Env: a program passes os.Environ()), beside
	// the Agents.
	Self        *RemoteAgent
	Local       Conn
	SelfEnviron []string
	// EventMarker, on a relay, starts the lines by which it tells the
	// launcher above, on Stderr, that its subtree failed or lost a host
	// (see relayEvents), so that the head's FailureGrace or stop starts
	// when it would in a flat launch, not once the relay has ended.
	EventMarker string
}

// DefaultFanOut is the connections a launcher opens at most when the
// caller sets none: pdsh's default fan-out.
const DefaultFanOut = 32

// Dialer connects a Fanout to its hosts.
type Dialer interface {
	Dial(ctx context.Context, host string) (Conn, error)
}

// Conn is one host that a Dialer reached, or, for a relay's own agent,
// this machine.
type Conn interface {
	// Host names the host in messages.
	Host() string
	// HostName is what the host name resolved to, as the connection
	// dialed it (see rendezvousEndpoint).
	HostName() string
	// Start runs argv in dir with env added, writes stdin to it and keeps
	// its stdin open (see SSHProcess); stdout and stderr get its output.
	Start(ctx context.Context, dir string, env, argv []string, stdin []byte, stdout, stderr io.Writer) (Process, error)
	// Output runs a short shell script and returns its stdout (see
	// SSHClient.Output).
	Output(ctx context.Context, env []string, script string, in io.Reader) ([]byte, error)
	// Close ends the connection; the commands it runs see EOF on stdin.
	Close() error
}

// Process is a started agent, a remote one or a relay's own.
type Process interface {
	// Wait returns the exit status, 128+n after signal n; err only when
	// the status is unknown (the connection was lost).
	Wait() (code int, err error)
	Done() <-chan struct{}
	// CloseStdin asks the agent to stop (the stdin contract of SSHProcess).
	CloseStdin() error
	Signal(sig syscall.Signal) error
	// Close stops it: EOF on stdin and SIGTERM, SIGKILL later.
	Close()
}

type remoteEnd struct {
	i    int
	code int
	err  error
}

// Run dials the hosts (any failure fails the launch before anything
// starts), starts the agents and waits for them. err is non-nil only when
// the launch itself failed; the status of a job that started is code. In
// a tree, a relay that cannot reach a host of its share reports it naming
// the host, and the job is stopped as if a host had been lost.
//
// Beyond FanOut hosts, unless NoTree is set or Relay is empty, the launch
// is a tree: Run reaches the first FanOut hosts only, and each of them
// runs a relay that starts its own agent and launches its share of the
// other hosts the same way (see treeShares and RelayPlan), so that no
// launcher holds more than FanOut connections. A relay's status is its
// subtree's, by the rules above, and its stdout and stderr carry its
// subtree's output, so the head sees what a flat launch shows. Every relay
// reaches its share by the host names given, through its own ssh_config:
// a name known only to the head's needs NoTree.
//
// The cost of a host (a TCP connect, an SSH key exchange and public key
// authentication, then a session whose exec forks the login shell) is
// paid by all hosts at once, up to FanOut set-ups at a time; the hosts
// used to be started one after another after dialing, which made a flat
// launch's time grow by a session round trip and a fork per host.
func (f *Fanout) Run(ctx context.Context) (code int, err error) {
	if len(f.Agents) == 0 && f.Self == nil {
		return 0, errors.New("launcher: no hosts to launch on")
	}
	stopTimeout := cmp.Or(f.StopTimeout, 35*time.Second)
	grace := cmp.Or(f.FailureGrace, 2*time.Minute)
	fanOut := f.fanOut()
	dialer := f.Dialer
	if dialer == nil {
		if dialer, err = NewSSHDialer(f.SSH); err != nil {
			return 0, &LaunchError{err}
		}
	}
	var shares [][]int
	direct := len(f.Agents)
	if !f.NoTree && len(f.Relay) > 0 && len(f.Agents) > fanOut {
		shares = treeShares(len(f.Agents), fanOut)
		direct = len(shares)
	}

	conns, err := f.dialAll(ctx, dialer, f.Agents[:direct], fanOut)
	if err != nil {
		return 0, &LaunchError{err}
	}
	if f.Self != nil {
		local := f.Local
		if local == nil {
			local = newLocalConn(f.Self.Host, f.SSH.StopGrace, f.SelfEnviron)
		}
		conns = append(conns, local)
	}
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	defer closeAll()
	agents, err := f.withEndpoint(ctx, conns)
	if err != nil {
		return 0, &LaunchError{err}
	}
	paths, err := f.stage(ctx, conns[:direct], agents[:direct])
	if err != nil {
		return 0, &LaunchError{err}
	}
	launch := make([]RemoteAgent, direct, len(conns))
	markers := make([]string, direct)
	for i, a := range agents[:direct] {
		if paths[i] != "" {
			a.Argv = append([]string{paths[i]}, a.Argv[1:]...)
		}
		launch[i] = a
		if shares == nil || len(shares[i]) == 0 {
			continue
		}
		share := make([]RemoteAgent, len(shares[i]))
		for j, k := range shares[i] {
			share[j] = agents[k]
		}
		p := f.relayPlan(a, share)
		p.EventMarker = relayEventPrefix + crand.Text()
		markers[i] = p.EventMarker
		plan, err := p.encode()
		if err != nil {
			return 0, &LaunchError{err}
		}
		relay := slices.Clone(f.Relay)
		if paths[i] != "" {
			relay[0] = paths[i]
		}
		launch[i] = RemoteAgent{Host: a.Host, Argv: relay, Env: a.Env, Stdin: plan}
	}
	if f.Self != nil {
		launch = append(launch, *f.Self)
	}

	stdout := NewConsole(f.Stdout, ConsoleOptions{})
	stderr := NewConsole(f.Stderr, ConsoleOptions{})
	var writers []io.Closer
	defer func() {
		for _, w := range writers {
			w.Close()
		}
	}()
	// The processes outlive ctx: stopping them is Run's job, by signal.
	runCtx := context.WithoutCancel(ctx)
	reports := &reportsSeen{}
	outs := make([]io.Writer, len(launch))
	errOuts := make([]io.Writer, len(launch))
	events := make(chan relayEvent, len(launch))
	loopDone := make(chan struct{})
	defer close(loopDone)
	for i := range launch {
		out, errOut := stdout.Writer(""), &reportFilter{w: stderr.Writer(""), seen: reports}
		writers = append(writers, out, errOut)
		outs[i], errOuts[i] = out, errOut
		if i < direct && markers[i] != "" {
			errOuts[i] = &relayEvents{w: errOut, marker: []byte(markers[i]), i: i, events: events, done: loopDone}
		}
	}
	// All at once: each start is a round trip to sshd and a fork there.
	procs := make([]Process, len(launch))
	errs := make([]error, len(launch))
	var wg sync.WaitGroup
	for i, a := range launch {
		wg.Go(func() {
			procs[i], errs[i] = conns[i].Start(runCtx, f.Dir, a.Env, a.Argv, a.Stdin, outs[i], errOuts[i])
		})
	}
	wg.Wait()
	if i := slices.IndexFunc(errs, func(err error) bool { return err != nil }); i >= 0 {
		for _, p := range procs {
			if p != nil {
				p.Close()
			}
		}
		for _, p := range procs {
			if p != nil {
				p.Wait()
			}
		}
		return 0, fmt.Errorf("cannot start the agent on host %s: %w", launch[i].Host, errs[i])
	}
	f.Logger.Info().Int("hosts", len(procs)).Int("tree", len(f.Agents)-direct).Msg("started the remote agents")

	ends := make(chan remoteEnd, len(procs))
	for i, p := range procs {
		go func() {
			code, err := p.Wait()
			ends <- remoteEnd{i, code, err}
		}()
	}

	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		for _, p := range procs {
			p.CloseStdin()
		}
		for _, p := range procs {
			go p.Signal(syscall.SIGTERM)
		}
	}
	status, sig := 0, 0
	var deadline <-chan time.Time
	running := len(procs)
	// A relay tells the launcher above of its status as it changes, and
	// once of a lost host; in the order of their events, the head then
	// keeps the statuses as a flat launch would have seen them.
	toldStatus, toldLost := 0, false
	tell := func(lost bool) {
		if f.EventMarker == "" || sig != 0 {
			return
		}
		if status != toldStatus {
			toldStatus = status
			fmt.Fprintf(f.Stderr, "%s failed %d\n", f.EventMarker, status)
		}
		if lost && !toldLost {
			toldLost = true
			fmt.Fprintf(f.Stderr, "%s lost\n", f.EventMarker)
		}
	}
	for running > 0 {
		select {
		case ev := <-events:
			// A host in a relay's subtree failed or was lost: what its
			// own end would do here; the relay's own end comes later.
			if ev.code != 0 && (status == 0 || status == 1 && ev.code != 1) {
				status = ev.code
			}
			tell(ev.lost)
			switch {
			case ev.lost && !stopped:
				f.Logger.Warn().Str("relay", launch[ev.i].Host).Msg("a host of the relay's subtree was lost; stopping the job")
				deadline = time.After(stopTimeout)
				stop()
			case ev.code != 0 && deadline == nil:
				deadline = time.After(grace)
			}
		case e := <-ends:
			running--
			host := launch[e.i].Host
			c := e.code
			if e.err != nil {
				fmt.Fprintf(f.Stderr, "gorun: host %s: the remote agent was lost: %v\n", host, e.err)
				c = 1
			} else if c != 0 && sig == 0 {
				f.Logger.Warn().Str("host", host).Int("exit", c).Msg("remote agent failed")
			}
			if c != 0 && (status == 0 || status == 1 && c != 1) {
				status = c
			}
			tell(e.err != nil)
			switch {
			case e.err != nil && !stopped:
				// Its peers would wait for it until their rendezvous times out.
				deadline = time.After(stopTimeout)
				stop()
			case c != 0 && deadline == nil:
				deadline = time.After(grace)
			}
		case s := <-f.Signals:
			if n, ok := s.(syscall.Signal); ok && sig == 0 {
				sig = int(n)
				f.Logger.Warn().Str("signal", s.String()).Msg("stopping the remote agents")
				deadline = time.After(stopTimeout)
			}
			stop()
		case <-deadline:
			if !stopped {
				f.Logger.Warn().Msg("the other remote agents did not end after a failure; stopping them")
				stop()
				deadline = time.After(stopTimeout)
				continue
			}
			for i, p := range procs {
				select {
				case <-p.Done():
				default:
					fmt.Fprintf(f.Stderr, "gorun: host %s: the remote agent did not stop; closing its connection\n", launch[i].Host)
				}
			}
			closeAll()
			running = 0
		}
	}
	if sig != 0 {
		return 128 + sig, nil
	}
	return status, nil
}

func (f *Fanout) fanOut() int {
	if f.FanOut > 0 {
		return f.FanOut
	}
	return DefaultFanOut
}

// dialAll dials the hosts of agents, at most window at a time, each
// retried as retryDial allows; the first failure cancels the others and
// closes every connection made.
func (f *Fanout) dialAll(ctx context.Context, d Dialer, agents []RemoteAgent, window int) ([]Conn, error) {
	conns := make([]Conn, len(agents))
	errs := make([]error, len(agents))
	dialCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(window, len(agents)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(agents) || dialCtx.Err() != nil {
					return
				}
				conns[i], errs[i] = f.dialRetrying(dialCtx, d, agents[i].Host)
				if errs[i] != nil {
					cancel()
				}
			}
		})
	}
	wg.Wait()
	// The root cause, not a dial that the first failure cancelled.
	i := slices.IndexFunc(errs, func(err error) bool { return err != nil && !errors.Is(err, context.Canceled) })
	if i < 0 {
		i = slices.IndexFunc(errs, func(err error) bool { return err != nil })
	}
	if i < 0 && ctx.Err() != nil {
		i, errs[0] = 0, ctx.Err()
	}
	if i >= 0 {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		return nil, fmt.Errorf("cannot reach host %s: %w", agents[i].Host, errs[i])
	}
	return conns, nil
}

// dialRetrying dials host, again after a jittered, growing wait while the
// error is one that retryDial says a retry may cure, f.Retries times at most.
func (f *Fanout) dialRetrying(ctx context.Context, d Dialer, host string) (Conn, error) {
	for attempt := 0; ; attempt++ {
		c, err := d.Dial(ctx, host)
		if err == nil {
			return c, nil
		}
		if attempt >= f.Retries || !retryDial(err) || ctx.Err() != nil {
			if attempt > 0 {
				err = fmt.Errorf("%d attempts, the last: %w", attempt+1, err)
			}
			return nil, err
		}
		wait := retryDelay(attempt, f.RetryBackoff, rand.Float64())
		f.Logger.Debug().Err(err).Str("host", host).Dur("wait", wait).Msg("ssh connection dropped during set-up; retrying")
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// withEndpoint returns f.Agents with the rendezvous endpoint at their
// EndpointArg, asking the first host (conns[0]) for its address unless
// f.Endpoint is given. Each agent's EndpointArg is then 0: a relay that
// gets them passes them on as they are.
func (f *Fanout) withEndpoint(ctx context.Context, conns []Conn) ([]RemoteAgent, error) {
	if !slices.ContainsFunc(f.Agents, func(a RemoteAgent) bool { return a.EndpointArg > 0 }) {
		return f.Agents, nil
	}
	var conn string
	if f.Endpoint == "" {
		var err error
		if conn, err = sshConnection(ctx, conns[0]); err != nil {
			return nil, fmt.Errorf("cannot find the address of host %s: %w", f.Agents[0].Host, err)
		}
	}
	endpoint := rendezvousEndpoint(f.Endpoint, f.EndpointPort, conn, conns[0].HostName())
	f.Logger.Info().Str("endpoint", endpoint).Str("ssh_connection", strings.TrimSpace(conn)).Msg("rendezvous endpoint")
	agents := slices.Clone(f.Agents)
	for i, a := range agents {
		if a.EndpointArg <= 0 {
			continue
		}
		if a.EndpointArg >= len(a.Argv) {
			return nil, fmt.Errorf("launcher: the agent for host %s has no argument %d for the endpoint", a.Host, a.EndpointArg)
		}
		agents[i].Argv = slices.Clone(a.Argv)
		agents[i].Argv[a.EndpointArg] = endpoint
		agents[i].EndpointArg = 0
	}
	return agents, nil
}

// stage copies f.Stage to the hosts of conns that lack it, all at once,
// and returns the staged path on each; without f.Stage, "" for each.
func (f *Fanout) stage(ctx context.Context, conns []Conn, agents []RemoteAgent) ([]string, error) {
	paths := make([]string, len(agents))
	if f.Stage == nil {
		return paths, nil
	}
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() {
			path, copied, err := stageBinary(ctx, conns[i], *f.Stage, f.StageTo, agents[i].Env)
			if err != nil {
				errs[i] = err
				return
			}
			paths[i] = path
			f.Logger.Info().Str("host", agents[i].Host).Str("path", path).Bool("copied", copied).Msg("staged gorun")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("--stage-binary: %w", err)
	}
	return paths, nil
}

// LaunchError is a host the head could not start its agent on: not
// reachable, its key unknown or changed, its address or system unfit.
type LaunchError struct{ Err error }

func (e *LaunchError) Error() string { return e.Err.Error() }
func (e *LaunchError) Unwrap() error { return e.Err }

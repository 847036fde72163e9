package launcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
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
	// SSHClient.Stage), at StageTo or in the host's cache folder, and
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
}

type remoteEnd struct {
	i    int
	code int
	err  error
}

// Run dials every host (any failure fails the launch before anything
// starts), starts the agents and waits for them. err is non-nil only when
// the launch itself failed; the status of a job that started is code.
func (f *Fanout) Run(ctx context.Context) (code int, err error) {
	if len(f.Agents) == 0 {
		return 0, errors.New("launcher: no hosts to launch on")
	}
	stopTimeout := cmp.Or(f.StopTimeout, 35*time.Second)
	grace := cmp.Or(f.FailureGrace, 2*time.Minute)

	// Dial all hosts at once; one failure closes every connection.
	clients := make([]*SSHClient, len(f.Agents))
	errs := make([]error, len(f.Agents))
	dialCtx, cancelDial := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, a := range f.Agents {
		wg.Go(func() {
			clients[i], errs[i] = DialSSH(dialCtx, a.Host, f.SSH)
			if errs[i] != nil {
				cancelDial()
			}
		})
	}
	wg.Wait()
	cancelDial()
	closeAll := func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	}
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			closeAll()
			return 0, &LaunchError{fmt.Errorf("cannot reach host %s: %w", f.Agents[i].Host, err)}
		}
	}
	for i, err := range errs {
		if err != nil {
			closeAll()
			return 0, &LaunchError{fmt.Errorf("cannot reach host %s: %w", f.Agents[i].Host, err)}
		}
	}
	defer closeAll()
	agents, err := f.withEndpoint(ctx, clients)
	if err != nil {
		return 0, &LaunchError{err}
	}
	if agents, err = f.stage(ctx, clients, agents); err != nil {
		return 0, &LaunchError{err}
	}

	stdout := NewConsole(f.Stdout, ConsoleOptions{})
	stderr := NewConsole(f.Stderr, ConsoleOptions{})
	procs := make([]*SSHProcess, len(f.Agents))
	var writers []io.Closer
	defer func() {
		for _, w := range writers {
			w.Close()
		}
	}()
	// The processes outlive ctx: stopping them is Run's job, by signal.
	runCtx := context.WithoutCancel(ctx)
	reports := &reportsSeen{}
	for i, a := range agents {
		out, errOut := stdout.Writer(""), &reportFilter{w: stderr.Writer(""), seen: reports}
		writers = append(writers, out, errOut)
		p, err := clients[i].Start(runCtx, f.Dir, a.Env, a.Argv, out, errOut)
		if err == nil && len(a.Stdin) > 0 {
			if _, err = p.stdin.Write(a.Stdin); err != nil {
				p.Close()
				p.Wait()
			}
		}
		if err != nil {
			for _, p := range procs[:i] {
				p.Close()
			}
			for _, p := range procs[:i] {
				p.Wait()
			}
			return 0, fmt.Errorf("cannot start the agent on host %s: %w", a.Host, err)
		}
		procs[i] = p
	}
	f.Logger.Info().Int("hosts", len(procs)).Msg("started the remote agents")

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
	for running > 0 {
		select {
		case e := <-ends:
			running--
			host := f.Agents[e.i].Host
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
					fmt.Fprintf(f.Stderr, "gorun: host %s: the remote agent did not stop; closing its connection\n", f.Agents[i].Host)
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

// withEndpoint returns f.Agents with the rendezvous endpoint at their
// EndpointArg, asking the first host for its address unless f.Endpoint
// is given.
func (f *Fanout) withEndpoint(ctx context.Context, clients []*SSHClient) ([]RemoteAgent, error) {
	if !slices.ContainsFunc(f.Agents, func(a RemoteAgent) bool { return a.EndpointArg > 0 }) {
		return f.Agents, nil
	}
	var conn string
	if f.Endpoint == "" {
		var err error
		if conn, err = clients[0].sshConnection(ctx); err != nil {
			return nil, fmt.Errorf("cannot find the address of host %s: %w", f.Agents[0].Host, err)
		}
	}
	endpoint := rendezvousEndpoint(f.Endpoint, f.EndpointPort, conn, clients[0].hostname)
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
	}
	return agents, nil
}

// stage copies f.Stage to every host that lacks it, all hosts at once, and
// returns agents with the staged path as their program; without f.Stage
// it returns agents as they are.
func (f *Fanout) stage(ctx context.Context, clients []*SSHClient, agents []RemoteAgent) ([]RemoteAgent, error) {
	if f.Stage == nil {
		return agents, nil
	}
	agents = slices.Clone(agents)
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() {
			path, copied, err := clients[i].Stage(ctx, *f.Stage, f.StageTo, agents[i].Env)
			if err != nil {
				errs[i] = err
				return
			}
			agents[i].Argv = append([]string{path}, agents[i].Argv[1:]...)
			f.Logger.Info().Str("host", agents[i].Host).Str("path", path).Bool("copied", copied).Msg("staged gorun")
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("--stage-binary: %w", err)
	}
	return agents, nil
}

// LaunchError is a host the head could not start its agent on: not
// reachable, its key unknown or changed, its address or system unfit.
type LaunchError struct{ Err error }

func (e *LaunchError) Error() string { return e.Err.Error() }
func (e *LaunchError) Unwrap() error { return e.Err }

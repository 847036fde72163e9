package launcher

import (
	"context"
	"errors"
	"io"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"
)

// localConn runs a relay's own agent as a child process: it is a Conn to
// this machine, so that one Fanout loop handles it beside the remote ones.
type localConn struct {
	host    string
	grace   time.Duration
	environ []string // the child's environment before its own variables

	mu    sync.Mutex
	procs []*localProcess
}

func newLocalConn(host string, grace time.Duration, environ []string) *localConn {
	if grace <= 0 {
		grace = defaultSSHStopGrace
	}
	return &localConn{host: host, grace: grace, environ: environ}
}

func (c *localConn) Host() string     { return c.host }
func (c *localConn) HostName() string { return c.host }

func (c *localConn) Output(context.Context, []string, string, io.Reader) ([]byte, error) {
	return nil, errors.New("launcher: a relay runs no scripts on its own host")
}

// Start runs argv with env added to the relay's environment. The child
// leads a process group of its own: a relay is stopped by a signal to its
// group (see SSHProcess.Signal), and its agent must hear of that once,
// from the relay's stop, as EOF on stdin and SIGTERM; a second SIGTERM
// would kill its workers at once.
func (c *localConn) Start(ctx context.Context, dir string, env, argv []string, stdin []byte, stdout, stderr io.Writer) (Process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(slices.Clone(c.environ), env...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Workers that outlive the agent may hold its output open.
	cmd.WaitDelay = c.grace
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &localProcess{cmd: cmd, stdin: in, grace: c.grace, done: make(chan struct{})}
	go p.wait()
	if _, err := in.Write(stdin); err != nil {
		p.Close()
		p.Wait()
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// Close kills what it started that still runs.
func (c *localConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		p.Signal(syscall.SIGKILL)
	}
	return nil
}

type localProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	grace time.Duration
	done  chan struct{}
	code  int

	closeOnce sync.Once
}

func (p *localProcess) wait() {
	p.cmd.Wait()
	p.code = p.cmd.ProcessState.ExitCode()
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		p.code = 128 + int(ws.Signal())
	}
	close(p.done)
}

func (p *localProcess) Wait() (int, error) {
	<-p.done
	return p.code, nil
}

func (p *localProcess) Done() <-chan struct{} { return p.done }

func (p *localProcess) CloseStdin() error { return p.stdin.Close() }

// Signal signals the agent alone, not its group: the agent stops its
// workers itself.
func (p *localProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	return p.cmd.Process.Signal(sig)
}

func (p *localProcess) Close() {
	p.closeOnce.Do(func() {
		p.stdin.Close()
		p.Signal(syscall.SIGTERM)
		go func() {
			select {
			case <-p.done:
			case <-time.After(p.grace):
				p.Signal(syscall.SIGKILL)
			}
		}()
	})
}

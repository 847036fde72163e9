package launcher

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// dropProxy listens on a loopback address and forwards connections to
// target, except the first drops, which it closes at once, as sshd does
// past its MaxStartups.
func dropProxy(t *testing.T, target string, drops int) (addr string, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int64{}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if accepted.Add(1) <= int64(drops) {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Go(func() { io.Copy(s, c); s.Close() })
			wg.Go(func() { io.Copy(c, s); c.Close() })
		}
	})
	return l.Addr().String(), accepted
}

func TestFanoutRetriesDroppedHandshake(t *testing.T) {
	e := newSSHEnv(t)
	s := e.StartSSHD(t, "127.0.0.1")
	cfg := testConfig(t, e)

	launch := func(drops, retries int) (string, int64, int, error) {
		addr, accepted := dropProxy(t, s.Addr, drops)
		e.AddKnownHost(t, addr, s.HostKeys["ed25519"])
		var out bytes.Buffer
		f := Fanout{
			Agents: []RemoteAgent{{Host: addr, Argv: []string{"/bin/sh", "-c", "echo up"}}},
			SSH:    cfg, Stdout: &out, Stderr: io.Discard, Logger: testLogger(t),
			Retries: retries, RetryBackoff: 10 * time.Millisecond,
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		code, err := f.Run(ctx)
		return out.String(), accepted.Load(), code, err
	}

	out, accepted, code, err := launch(2, 2)
	if err != nil || code != 0 || out != "up\n" || accepted != 3 {
		t.Errorf("two drops, two retries: Run = %d, %v, output %q after %d connections; want 0, up, 3", code, err, out, accepted)
	}

	_, accepted, _, err = launch(3, 2)
	var le *LaunchError
	if !errors.As(err, &le) || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) || !strings.Contains(err.Error(), "3 attempts") || accepted != 3 {
		t.Errorf("three drops, two retries: Run = %v after %d connections; want a launch error after 3 attempts, the last EOF or a reset", err, accepted)
	}

	// A refused key is not retried.
	addr, proxied := dropProxy(t, s.Addr, 0)
	e.AddKnownHost(t, addr, s.HostKeys["ed25519"])
	other := e.Dir + "/other_key"
	keygen(t, other, "ed25519")
	bad := cfg
	bad.IdentityFiles = []string{other}
	f := Fanout{Agents: []RemoteAgent{{Host: addr, Argv: []string{"true"}}}, SSH: bad, Stdout: io.Discard, Stderr: io.Discard,
		Logger: testLogger(t), Retries: 3, RetryBackoff: 10 * time.Millisecond}
	if _, err := f.Run(context.Background()); err == nil || proxied.Load() != 1 {
		t.Errorf("a refused key: Run = %v after %d connections; want an error after 1", err, proxied.Load())
	}
}

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/route"
	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/rendezvous"
)

const (
	jobSecret   = "e2e-secret-of-the-job-0123456789"
	wrongSecret = "e2e-secret-of-another-job-987654"
)

// authJob is the command line of one agent of a two-node c10d job on
// loopback, with extra --rdzv-conf keys.
func authJob(endpoint, runID, conf string, program ...string) []string {
	return append([]string{
		"--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", endpoint, "--rdzv-id", runID,
		"--rdzv-conf", "last_call_timeout=1,heartbeat_interval=0.25,heartbeat_misses=3" + conf,
	}, program...)
}

// tokenFile writes secret into a file only its owner reads.
func tokenFile(t *testing.T, secret string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Two agents with the same secret, one from the environment and one from
// a token file, form the job; agents without it, or with another, are
// refused by the job's store with a clear error, and the job goes on.
func TestAuthAgentsWithTheSecretFormTheJob(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	program := []string{bin("elastic"), "-steps", "40", "-step-delay", "20ms", "-log-every", "10",
		"-checkpoint", filepath.Join(t.TempDir(), "ckpt")}
	withEnv := append(testEnv(t), rdzvTokenEnv+"="+jobSecret)
	host := startCommandEnv(t, withEnv, bin("gorun"), authJob(endpoint, "auth", "", program...)...)
	host.awaitOutput(t, "hosting the rendezvous store")
	if !strings.Contains(host.out.String(), "secret=true") {
		t.Fatalf("the store is hosted without the secret:\n%s", host.out.String())
	}

	// Before the second good agent, so that the round waits for it: the
	// strangers cannot take its place.
	none := startAgent(t, authJob(endpoint, "auth", "", program...)...)
	wrong := startAgent(t, authJob(endpoint, "auth", ",token_file="+tokenFile(t, wrongSecret), program...)...)
	for _, tc := range []struct {
		a    *agent
		want string
	}{
		{none, "the store requires the job's secret, and this agent has none"},
		{wrong, "it is a gorun store with another secret"},
	} {
		if code := tc.a.wait(t, 30*time.Second); code == 0 || !strings.Contains(tc.a.out.String(), tc.want) || !strings.Contains(tc.a.out.String(), endpoint) {
			t.Fatalf("agent %v exited %d; want a failure naming %s and saying %q:\n%s", tc.a.cmd.Args, code, endpoint, tc.want, tc.a.out.String())
		}
	}

	good := startAgent(t, authJob(endpoint, "auth", ",token_file="+tokenFile(t, jobSecret), program...)...)
	for _, a := range []*agent{host, good} {
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %v exited %d:\n%s", a.cmd.Args, code, a.out.String())
		}
	}
	all := host.out.String() + good.out.String()
	if !strings.Contains(all, "finished 40 steps with world 4") || strings.Contains(all, "resumed") {
		t.Errorf("the job did not run with both good agents:\n%s", all)
	}
	for _, want := range []string{"refused a connection that did not authenticate", "a client hung up on the store's proof"} {
		if !strings.Contains(host.out.String(), want) {
			t.Errorf("the store's host did not log %q:\n%s", want, host.out.String())
		}
	}
	if strings.Contains(all, "the rendezvous store has no secret") {
		t.Errorf("warned of an open store:\n%s", all)
	}
}

// An agent whose endpoint is taken by a store that does not know the
// secret (another user's gorun, or anything that listens) fails, naming
// the endpoint, and writes nothing to it.
func TestAuthAgentRefusesARogueStore(t *testing.T) {
	t.Run("our server without the secret", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := rendezvous.NewServer(rendezvous.ServerOptions{})
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		endpoint := l.Addr().String()
		a := startCommandEnv(t, append(testEnv(t), rdzvTokenEnv+"="+jobSecret), bin("gorun"),
			authJob(endpoint, "rogue", ",read_timeout=3", "true")...)
		if code := a.wait(t, 30*time.Second); code == 0 || !strings.Contains(a.out.String(), "did not prove that it knows this agent's secret") ||
			!strings.Contains(a.out.String(), endpoint) {
			t.Fatalf("agent exited %d; want a failure naming %s:\n%s", code, endpoint, a.out.String())
		}
		if n, err := srv.Store().NumKeys(context.Background()); err != nil || n != 0 {
			t.Fatalf("the rogue store holds %d keys (%v)", n, err)
		}
	})
	t.Run("a plain listener", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		var mu sync.Mutex
		var got [][]byte
		go func() {
			for {
				nc, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer nc.Close()
					nc.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
					nc.SetReadDeadline(time.Now().Add(30 * time.Second))
					b, _ := io.ReadAll(nc)
					mu.Lock()
					got = append(got, b)
					mu.Unlock()
				}()
			}
		}()
		endpoint := l.Addr().String()
		a := startAgent(t, authJob(endpoint, "rogue", ",token_file="+tokenFile(t, jobSecret), "true")...)
		if code := a.wait(t, 30*time.Second); code == 0 || !strings.Contains(a.out.String(), "it does not authenticate") ||
			!strings.Contains(a.out.String(), endpoint) {
			t.Fatalf("agent exited %d; want a failure naming %s:\n%s", code, endpoint, a.out.String())
		}
		if !waitFor(10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 }) {
			t.Fatal("the rogue saw no connection")
		}
		mu.Lock()
		defer mu.Unlock()
		for _, b := range got {
			if len(b) != 40 || !bytes.HasPrefix(b, []byte("GORUNAU1")) {
				t.Fatalf("the rogue got %q: want the agent's hello and nothing else", b)
			}
		}
	})
}

// A secret that is short, or in a file others may read, is refused before
// anything starts.
func TestAuthBadSecretsAreUsageErrors(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	open := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(open, []byte(jobSecret), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		conf string
		want string
	}{
		{[]string{rdzvTokenEnv + "=short"}, "", "too short"},
		{nil, ",token_file=" + open, "others may read it (mode 0644): chmod 600 it"},
		{nil, ",token_file=" + filepath.Join(t.TempDir(), "missing"), "no such file"},
	} {
		j := gorun(t, tc.env, authJob(endpoint, "bad", tc.conf, "true")...)
		if j.code != 2 || !strings.Contains(j.stderr, tc.want) {
			t.Errorf("%v %s: want exit 2 saying %q, got:\n%s", tc.env, tc.conf, tc.want, j)
		}
	}
}

// Without a secret, a store that listens beyond loopback says it is open.
func TestAuthOpenStoreIsWarnedAbout(t *testing.T) {
	host, err := route.SourceAddr(context.Background(), "192.0.2.1:9")
	if err == nil && net.ParseIP(host).IsLoopback() {
		err = fmt.Errorf("the way out is %s", host)
	}
	testenv.MustHave(t, err, "an address beyond loopback", "")
	endpoint := net.JoinHostPort(host, strconv.Itoa(freePort(t)))
	j := gorun(t, nil, "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "true")
	if j.code != 0 || !strings.Contains(j.stderr, "the rendezvous store has no secret: anyone who can reach this port") {
		t.Fatalf("want a warning of an open store:\n%s", j)
	}
	j = gorun(t, []string{rdzvTokenEnv + "=" + jobSecret}, "--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "true")
	if j.code != 0 || strings.Contains(j.stderr, "has no secret") {
		t.Fatalf("a job with a secret warned, or failed:\n%s", j)
	}
}

// procsHolding lists the processes whose argv or environment holds s.
func procsHolding(s string) []string {
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err == nil && bytes.Contains(b, []byte(s)) {
				found = append(found, fmt.Sprintf("%s/%s: %q", d, f, bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
		}
	}
	return found
}

// The head passes the job's secret to the remote agents over each SSH
// session: the job runs, and while it does no process on either host
// (the hosts are this machine) holds the secret in its argv or its
// environment, the workers' included.
func TestAuthSSHHeadPassesTheSecret(t *testing.T) {
	c := newSSHCluster(t)
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	worker := script(t, dir, "worker.sh", fmt.Sprintf(`echo "rank $RANK ready"
i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo "rank $RANK done"
`, release))
	secret := tokenFile(t, jobSecret)
	args := c.headArgs(t, "--hosts", "127.0.0.1:1,127.0.0.2:1", worker)
	for i, a := range args {
		if a == "--rdzv-conf" {
			args[i+1] += ",token_file=" + secret
		}
	}
	h := startHead(t, dir, args...)
	h.awaitOutput(t, "rank 0 ready")
	h.awaitOutput(t, "rank 1 ready")
	leaks := procsHolding(jobSecret)
	// The scan sees what it looks for: a process with a marker in its argv.
	marker := exec.Command("sleep", "30")
	marker.Args[0] = "marker-" + t.Name()
	if err := marker.Start(); err != nil {
		t.Fatal(err)
	}
	seen := waitFor(10*time.Second, func() bool { return len(procsHolding(marker.Args[0])) > 0 })
	marker.Process.Kill()
	marker.Wait()
	if !seen {
		t.Fatalf("the /proc scan does not see a process's argv")
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("head exited %d:\n%s", code, h.out.String())
	}
	if len(leaks) > 0 {
		t.Fatalf("the secret is in a process's argv or environment:\n%s", strings.Join(leaks, "\n"))
	}
	out := h.out.String()
	for _, want := range []string{"secret=true", "rank 0 done", "rank 1 done"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "has no secret") {
		t.Errorf("the store is open:\n%s", out)
	}
}

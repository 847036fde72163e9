package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/elastic"
)

// Issue 23: during a 2-node c10d job with a rendezvous secret, `gorun
// status --rdzv-endpoint --rdzv-id` from a machine without any agent (a
// TMPDIR where no status socket exists) reads every rank from the job's
// store; --json parses; without the secret, or with another run id, it
// fails and says why.
func TestStatusFromTheRendezvousEndpoint(t *testing.T) {
	dir := t.TempDir()
	worker := script(t, dir, "worker.sh", fmt.Sprintf("while [ ! -e %s/finish ]; do sleep 0.1; done\n", dir))
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	token := tokenFile(t, jobSecret)
	conf := ",token_file=" + token
	var agents []*agent
	var metricsAddrs []string
	for range 2 {
		env := append(os.Environ(), "TMPDIR="+t.TempDir())
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		args := append([]string{"--metrics-addr", addr}, authJob(endpoint, "remote", conf, worker)...)
		agents = append(agents, startCommandEnv(t, env, bin("gorun"), args...))
		metricsAddrs = append(metricsAddrs, addr)
	}
	logs := func() string { return agents[0].out.String() + "\n---\n" + agents[1].out.String() }
	away := []string{"TMPDIR=" + t.TempDir()} // no agent's socket here
	remote := []string{"status", "--rdzv-endpoint", endpoint, "--rdzv-id", "remote", "--rdzv-conf", "token_file=" + token}

	var docs []elastic.NodeStatus
	var last job
	if !waitFor(60*time.Second, func() bool {
		last = gorun(t, away, append(remote, "--json")...)
		if last.code != 0 {
			return false
		}
		if err := json.Unmarshal([]byte(last.stdout), &docs); err != nil {
			t.Fatalf("gorun status --json does not parse: %v\n%s", err, last)
		}
		return allRunning(docs, 4, 0)
	}) {
		t.Fatalf("gorun status --rdzv-endpoint never listed 4 running ranks:\n%s\n%s", last, logs())
	}
	for _, d := range docs {
		if d.RunID != "remote" || d.Nodes != 2 {
			t.Errorf("node %d: run %q, %d nodes; want remote, 2", d.NodeRank, d.RunID, d.Nodes)
		}
	}
	table := gorun(t, away, remote...)
	for _, d := range docs {
		for _, w := range d.Workers {
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^remote\s+\S+\s+%d\s+%d\s+%d\s+%d\s+running\s`, d.NodeRank, w.Rank, w.LocalRank, w.Pid)).MatchString(table.stdout) {
				t.Errorf("the table lacks rank %d (pid %d):\n%s", w.Rank, w.Pid, table)
			}
		}
	}
	// The secret may come from the environment too.
	if j := gorun(t, append(away, rdzvTokenEnv+"="+jobSecret), remote[:5]...); j.code != 0 || !strings.Contains(j.stdout, "running") {
		t.Errorf("gorun status with $%s: want the table:\n%s", rdzvTokenEnv, j)
	}

	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no secret", away, remote[:5], "requires the job's secret"},
		{"wrong secret", away, append(remote[:5:5], "--rdzv-conf", "token_file="+tokenFile(t, wrongSecret)), "did not prove"},
		{"another run", away, []string{"status", "--rdzv-endpoint", endpoint, "--rdzv-id", "other", "--rdzv-conf", "token_file=" + token}, `no node of run "other"`},
		{"no run id", away, []string{"status", "--rdzv-endpoint", endpoint}, "needs the job's --rdzv-id"},
	} {
		j := gorun(t, c.env, c.args...)
		if j.code == 0 || !strings.Contains(j.stderr, c.want) {
			t.Errorf("%s: want a failure saying %q:\n%s", c.name, c.want, j)
		}
	}

	// The agent that hosts the rendezvous store exposes its figures: both
	// agents' connections, and the reads of gorun status among its requests.
	hostsStore := func(addr string) bool {
		return metric(addr, `gorun_store_connections{store="rendezvous"}`) >= 2 &&
			metric(addr, `gorun_store_requests_total{op="check",store="rendezvous"}`) > 0 &&
			metric(addr, `gorun_store_bytes{store="rendezvous"}`) > 0
	}
	if !waitFor(10*time.Second, func() bool { return hostsStore(metricsAddrs[0]) || hostsStore(metricsAddrs[1]) }) {
		t.Errorf("no agent exposes the rendezvous store's figures: connections %v/%v",
			metric(metricsAddrs[0], `gorun_store_connections{store="rendezvous"}`), metric(metricsAddrs[1], `gorun_store_connections{store="rendezvous"}`))
	}

	if err := os.WriteFile(filepath.Join(dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, a := range agents {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, logs())
		}
	}
}

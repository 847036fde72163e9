package launcher

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// The keeper's environment is its markers and nothing of the agent's,
// and it reads them through the lookup it is given.
func TestKeeperEnvironment(t *testing.T) {
	t.Setenv("GORUN_TEST_AGENT_ONLY", "1") // in the agent's environment, not the keeper's
	k, err := startKeeper("/bin/true", []string{keeperCgroupEnv + "=/sys/fs/cgroup/x", keeperMarkEnv + "=m"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{keeperCgroupEnv + "=/sys/fs/cgroup/x", keeperMarkEnv + "=m", keeperEnv + "=1"}
	if !slices.Equal(k.cmd.Env, want) {
		t.Errorf("keeper's environment %q, want %q", k.cmd.Env, want)
	}
	k.Close()

	env := map[string]string{keeperCgroupEnv: "/sys/fs/cgroup/job", keeperMarkEnv: "mark"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	if cgroup, mark := keeperJob(lookup); cgroup != "/sys/fs/cgroup/job" || mark != "mark" {
		t.Errorf("keeperJob = %q, %q", cgroup, mark)
	}
	if MaybeRunKeeper(lookup) {
		t.Error("MaybeRunKeeper ran a keeper without its mark")
	}
}

// A relay's own agent gets SelfEnviron, then its own variables: not the
// relay process's environment.
func TestLocalConnEnvironment(t *testing.T) {
	t.Setenv("GORUN_TEST_RELAY_ONLY", "1")
	c := newLocalConn("here", time.Second, []string{"PATH=/usr/bin:/bin", "BASE=b", "OVER=base"})
	defer c.Close()
	var stdout, stderr bytes.Buffer
	p, err := c.Start(context.Background(), t.TempDir(), []string{"OVER=agent"},
		[]string{"/bin/sh", "-c", `echo "$BASE $OVER ${GORUN_TEST_RELAY_ONLY:-unset}"`}, nil, &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("exit %d, %v: %s", code, err, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != "b agent unset" {
		t.Errorf("the agent saw %q, want %q", got, "b agent unset")
	}
}

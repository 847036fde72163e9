package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Issue 4, test 5: a real PyTorch 1.13 gloo job across two agents on the
// c10d rendezvous survives an injected worker failure: every node restarts
// once and the job completes.
func TestTorchJobOnElasticRendezvous(t *testing.T) {
	py := python(t)
	args := append(elasticJob(t, "2", "--max-restarts", "1", "--python", py), "testdata/torch_elastic.py")
	agents := []*agent{startAgent(t, args...), startAgent(t, args...)}
	var all string
	for i, a := range agents {
		if code := a.wait(t, 120*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
		all += a.out.String()
	}
	if !strings.Contains(all, "rank=3 fails on purpose") {
		t.Errorf("the failure was not injected:\n%s", all)
	}
	for r := 0; r < 4; r++ {
		want := fmt.Sprintf("rank=%d world=4 restart=1 group=%d sum=10", r, r/2)
		if !strings.Contains(all, want) {
			t.Errorf("missing %q:\n%s", want, all)
		}
	}
}

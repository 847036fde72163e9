package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every collective of allreduce-perf checks its results on every rank; run
// them across real processes for a power of two and for an odd world.
func TestCollectivesAcrossProcesses(t *testing.T) {
	row := regexp.MustCompile(`(?m)^\[rank0\]:\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-1\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)$`)
	for _, world := range []string{"2", "5"} {
		for _, op := range []string{"allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall"} {
			for _, dtype := range []string{"float32", "bfloat16", "int64"} {
				j := gorun(t, nil, "--nproc-per-node", world, "--local-ranks-filter", "0", bin("allreduce-perf"),
					"-b", "4", "-e", "300K", "-f", "9", "-o", op, "-d", dtype, "-w", "1", "-n", "2")
				rows := row.FindAllStringSubmatch(j.stdout, -1)
				if j.code != 0 || len(rows) != 6 {
					t.Fatalf("world %s %s %s: want 6 checked sizes:\n%s", world, op, dtype, j)
				}
				for _, r := range rows {
					if r[2] != "0" {
						t.Errorf("world %s %s %s size %s: %s wrong values", world, op, dtype, r[1], r[2])
					}
				}
			}
		}
	}
}

// Every reduction (-op) of the reducing collectives, checked on every rank
// of an odd world, whose float sums do not divide evenly for avg.
func TestReductionsAcrossProcesses(t *testing.T) {
	row := regexp.MustCompile(`(?m)^\[rank0\]:\s+(\d+)\s+\d+\s+\S+\s+(\S+)\s+-1\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)$`)
	for _, coll := range []string{"allreduce", "reduce_scatter"} {
		for _, red := range []string{"prod", "max", "min", "avg"} {
			for _, dtype := range []string{"float32", "float64", "bfloat16", "int64"} {
				if red == "avg" && dtype == "int64" {
					continue
				}
				j := gorun(t, nil, "--nproc-per-node", "3", "--local-ranks-filter", "0", bin("allreduce-perf"),
					"-b", "4", "-e", "300K", "-f", "9", "-o", coll, "-op", red, "-d", dtype, "-w", "1", "-n", "2")
				rows := row.FindAllStringSubmatch(j.stdout, -1)
				if j.code != 0 || len(rows) != 6 {
					t.Fatalf("%s -op %s -d %s: want 6 checked sizes:\n%s", coll, red, dtype, j)
				}
				for _, r := range rows {
					if r[2] != red || r[3] != "0" {
						t.Errorf("%s -op %s -d %s size %s: redop column %q, %s wrong values", coll, red, dtype, r[1], r[2], r[3])
					}
				}
			}
		}
	}
	j := gorun(t, nil, "--nproc-per-node", "1", bin("allreduce-perf"), "-op", "avg", "-d", "int32", "-b", "8", "-e", "8")
	if j.code != 1 || !strings.Contains(j.stderr, "-op avg needs a floating-point -d, not int32") {
		t.Fatalf("-op avg -d int32: want a clear refusal:\n%s", j)
	}
}

// allreduce-perf's buffers of 4 MiB and more live on huge pages it maps
// itself; the collectives read and write them, across processes, as they
// do the Go heap's.
func TestHugePageBuffers(t *testing.T) {
	row := regexp.MustCompile(`(?m)^\[rank0\]:\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-1\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)$`)
	for _, op := range []string{"allreduce", "allgather", "alltoall"} {
		j := gorun(t, nil, "--nproc-per-node", "2", "--local-ranks-filter", "0", bin("allreduce-perf"),
			"-sizes", "4M,6M", "-o", op, "-w", "1", "-n", "1")
		rows := row.FindAllStringSubmatch(j.stdout, -1)
		if j.code != 0 || len(rows) != 2 || rows[0][2] != "0" || rows[1][2] != "0" {
			t.Fatalf("%s on huge pages: want 2 sizes checked, none wrong:\n%s", op, j)
		}
	}
}

// --backend reaches Go workers: tcp always runs; nccl, which cannot run two
// ranks here (no GPU, or one shared), fails Init saying why, on every rank.
func TestBackendFlag(t *testing.T) {
	j := gorun(t, nil, "--backend", "tcp", "--nproc-per-node", "2", bin("allreduce-perf"), "-b", "8", "-e", "8")
	if j.code != 0 || !strings.Contains(j.stdout, "backend tcp") {
		t.Fatalf("--backend tcp:\n%s", j)
	}
	j = gorun(t, nil, "--backend", "nccl", "--nproc-per-node", "2", bin("allreduce-perf"), "-b", "8", "-e", "8")
	if j.code != 1 || strings.Count(j.stderr, "runtime: backend nccl on rank") < 2 {
		t.Fatalf("--backend nccl: want every rank to fail Init naming the backend:\n%s", j)
	}
}

// The data-parallel example converges and keeps parameters identical.
func TestDDPExample(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "3", bin("ddp"), "-steps", "60", "-log-every", "20")
	if j.code != 0 {
		t.Fatalf("ddp failed:\n%s", j)
	}
	var losses []float64
	for _, m := range regexp.MustCompile(`step\s+\d+\s+loss (\S+)`).FindAllStringSubmatch(j.stdout, -1) {
		loss, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		losses = append(losses, loss)
	}
	if len(losses) < 2 || losses[len(losses)-1] > 0.8*losses[0] {
		t.Errorf("loss did not fall: %v\n%s", losses, j)
	}
	if !strings.Contains(j.stdout, "parameters identical on all 3 ranks") {
		t.Errorf("no proof of identical parameters:\n%s", j)
	}
}

func TestPipelineExample(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "4", bin("pipeline"), "-microbatches", "16")
	if j.code != 0 {
		t.Fatalf("pipeline failed:\n%s", j)
	}
	for _, want := range []string{"[rank0]: stage 0 (rank 0): all 16 results from rank 1 are right", "[rank2]: stage 0 (rank 2): all 16 results from rank 3 are right"} {
		if !strings.Contains(j.stdout, want) {
			t.Errorf("missing %q:\n%s", want, j)
		}
	}
}

// Go workers run unchanged under torchrun: torch 1.13's standalone mode has
// worker rank 0 host the store on MASTER_PORT.
func TestGoWorkersUnderTorchrun(t *testing.T) {
	py := python(t)
	torchrun := filepath.Join(filepath.Dir(py), "torchrun")
	cmd := exec.Command(torchrun, "--standalone", "--nproc_per_node", "3", "--redirects=1", "--tee=1", "--no_python",
		bin("ddp"), "-steps", "30")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("torchrun ddp: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "parameters identical on all 3 ranks") {
		t.Errorf("ddp under torchrun did not finish:\n%s", out)
	}
}

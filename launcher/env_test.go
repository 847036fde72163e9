package launcher

import (
	"maps"
	"strings"
	"testing"
)

// envMap turns an environment into a map, failing on duplicate keys.
func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := make(map[string]string, len(env))
	for _, entry := range env {
		key, value, _ := strings.Cut(entry, "=")
		if _, dup := m[key]; dup {
			t.Errorf("duplicate key %s in %q", key, env)
		}
		m[key] = value
	}
	return m
}

func TestEnvironSetsTheTorchrunContract(t *testing.T) {
	e := Env{
		Base:      []string{"HOME=/home/u", "RANK=99", "PATH=/bin", "HOME=/root"},
		LocalRank: 1, Rank: 5, LocalWorldSize: 4, WorldSize: 8,
		GroupRank: 1, GroupWorldSize: 2,
		RoleName: "trainer", RoleRank: 5, RoleWorldSize: 8,
		MasterAddr: "node0", MasterPort: 29500,
		RestartCount: 2, MaxRestarts: 3,
		RunID:         "job1",
		UseAgentStore: true,
		ErrorFile:     "logs/job1/attempt_2/1/error.json",
		Python:        true,
		Extra:         map[string]string{"GORUN_NODE": "node1"},
	}
	env := e.Environ()
	want := map[string]string{
		"HOME":                            "/root",
		"PATH":                            "/bin",
		"LOCAL_RANK":                      "1",
		"RANK":                            "5",
		"GROUP_RANK":                      "1",
		"ROLE_RANK":                       "5",
		"ROLE_NAME":                       "trainer",
		"ROLE_WORLD_SIZE":                 "8",
		"LOCAL_WORLD_SIZE":                "4",
		"WORLD_SIZE":                      "8",
		"GROUP_WORLD_SIZE":                "2",
		"MASTER_ADDR":                     "node0",
		"MASTER_PORT":                     "29500",
		"TORCHELASTIC_RESTART_COUNT":      "2",
		"TORCHELASTIC_MAX_RESTARTS":       "3",
		"TORCHELASTIC_RUN_ID":             "job1",
		"TORCHELASTIC_USE_AGENT_STORE":    "True",
		"TORCHELASTIC_ERROR_FILE":         "logs/job1/attempt_2/1/error.json",
		"OMP_NUM_THREADS":                 "1",
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
		"NCCL_ASYNC_ERROR_HANDLING":       "1",
		"PYTHONUNBUFFERED":                "1",
		"GORUN_NODE":                      "node1",
	}
	if got := envMap(t, env); !maps.Equal(got, want) {
		t.Errorf("Environ =\n%q\nwant\n%v", env, want)
	}
	if env[0] != "HOME=/root" || env[1] != "RANK=5" {
		t.Errorf("Base order not kept: %q", env[:2])
	}
}

func TestEnvironInheritsAndOmits(t *testing.T) {
	e := Env{
		Base: []string{
			"OMP_NUM_THREADS=8", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0",
			"NCCL_ASYNC_ERROR_HANDLING=3", "PYTHONUNBUFFERED=", "TORCHELASTIC_ERROR_FILE=agent.json",
		},
		LocalWorldSize: 4,
		Python:         true,
	}
	got := envMap(t, e.Environ())
	for key, want := range map[string]string{
		"OMP_NUM_THREADS":                 "8",
		"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
		"NCCL_ASYNC_ERROR_HANDLING":       "3",
		"PYTHONUNBUFFERED":                "",
		"TORCHELASTIC_USE_AGENT_STORE":    "False",
		// ErrorFile unset: the agent's own variable is inherited untouched.
		"TORCHELASTIC_ERROR_FILE": "agent.json",
	} {
		if got[key] != want {
			t.Errorf("%s = %q, want %q", key, got[key], want)
		}
	}

	single := envMap(t, Env{LocalWorldSize: 1}.Environ())
	for _, key := range []string{"OMP_NUM_THREADS", "PYTHONUNBUFFERED", "TORCHELASTIC_ERROR_FILE", "CUDA_VISIBLE_DEVICES"} {
		if value, ok := single[key]; ok {
			t.Errorf("%s=%q set for a single non-Python worker without error file", key, value)
		}
	}
}

func TestEnvironVirtualLocalRank(t *testing.T) {
	tests := []struct {
		name        string
		base        []string
		localRank   int
		wantDevices string
	}{
		{"no parent list", nil, 2, "2"},
		{"mapped through the parent's list", []string{"CUDA_VISIBLE_DEVICES=4, 5,6"}, 1, "5"},
		{"parent list too short", []string{"CUDA_VISIBLE_DEVICES=4"}, 1, ""},
	}
	for _, tt := range tests {
		e := Env{Base: tt.base, LocalRank: tt.localRank, Rank: 7, VirtualLocalRank: true}
		got := envMap(t, e.Environ())
		if got["LOCAL_RANK"] != "0" || got["RANK"] != "7" || got["CUDA_VISIBLE_DEVICES"] != tt.wantDevices {
			t.Errorf("%s: LOCAL_RANK=%q RANK=%q CUDA_VISIBLE_DEVICES=%q, want 0, 7, %q",
				tt.name, got["LOCAL_RANK"], got["RANK"], got["CUDA_VISIBLE_DEVICES"], tt.wantDevices)
		}
		if err := e.Validate(); (err != nil) != (tt.wantDevices == "") {
			t.Errorf("%s: Validate() = %v", tt.name, err)
		}
	}

	traditional := envMap(t, Env{Base: []string{"CUDA_VISIBLE_DEVICES=4,5"}, LocalRank: 1}.Environ())
	if traditional["LOCAL_RANK"] != "1" || traditional["CUDA_VISIBLE_DEVICES"] != "4,5" {
		t.Errorf("without virtual local rank: %v", traditional)
	}
}

func TestExtraMustBeGorunNames(t *testing.T) {
	e := Env{Extra: map[string]string{"GORUN_OK": "1", "PATH": "/evil", "GORUN_": "x", "GORUN_A=B": "y"}}
	err := e.Validate()
	if err == nil {
		t.Fatal("Validate accepted extra variables outside GORUN_")
	}
	for _, bad := range []string{`"PATH"`, `"GORUN_"`, `"GORUN_A=B"`} {
		if !strings.Contains(err.Error(), bad) {
			t.Errorf("Validate error %q does not name %s", err, bad)
		}
	}
	got := envMap(t, e.Environ())
	if got["GORUN_OK"] != "1" {
		t.Errorf("GORUN_OK = %q", got["GORUN_OK"])
	}
	for _, key := range []string{"PATH", "GORUN_", "GORUN_A"} {
		if _, ok := got[key]; ok {
			t.Errorf("invalid extra %s reached the environment", key)
		}
	}
	if err := (Env{Extra: map[string]string{"GORUN_OK": "1"}}).Validate(); err != nil {
		t.Errorf("Validate rejected a valid Env: %v", err)
	}
}

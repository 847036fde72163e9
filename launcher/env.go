package launcher

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ExtraPrefix is the namespace every gorun-specific worker variable lives in,
// so that gorun never collides with torchrun's contract or the user's names.
const ExtraPrefix = "GORUN_"

// Env is torchrun's worker environment contract for one worker
// (torchrun-contract.md §2).
type Env struct {
	Base []string // the agent's environment (os.Environ()), inherited

	LocalRank, Rank, LocalWorldSize, WorldSize int
	GroupRank, GroupWorldSize                  int
	RoleName                                   string
	RoleRank, RoleWorldSize                    int
	MasterAddr                                 string
	MasterPort                                 int
	RestartCount, MaxRestarts                  int
	RunID                                      string
	UseAgentStore                              bool   // TORCHELASTIC_USE_AGENT_STORE "True"/"False"
	ErrorFile                                  string // TORCHELASTIC_ERROR_FILE, set only when not empty

	// VirtualLocalRank gives the worker LOCAL_RANK=0 and narrows
	// CUDA_VISIBLE_DEVICES to its one device: entry LocalRank of the parent's
	// CUDA_VISIBLE_DEVICES list when Base sets it, else LocalRank itself.
	VirtualLocalRank bool
	// Python marks a Python program: PYTHONUNBUFFERED=1 unless Base sets it.
	Python bool
	// Extra holds gorun's own variables; every key must start with
	// ExtraPrefix (see Validate).
	Extra map[string]string
}

// Validate reports what Environ cannot honour: an Extra key outside
// ExtraPrefix or one that is not a valid name, and a virtual local rank with
// no entry in the parent's CUDA_VISIBLE_DEVICES (torchrun refuses that too).
func (e Env) Validate() error {
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(e.Extra)) {
		if !validExtraKey(key) {
			errs = append(errs, fmt.Errorf("launcher: extra variable %q: name must start with %s and contain no '=' or NUL", key, ExtraPrefix))
		}
	}
	if e.VirtualLocalRank {
		if _, ok := e.virtualDevice(); !ok {
			errs = append(errs, fmt.Errorf("launcher: local rank %d has no device in CUDA_VISIBLE_DEVICES=%q", e.LocalRank, e.lookupBase("CUDA_VISIBLE_DEVICES")))
		}
	}
	return errors.Join(errs...)
}

// Environ returns Base with the contract applied. Later settings replace
// earlier ones in place, so the result has no duplicate keys and keeps Base's
// order, with new keys appended. Environ never fails: an Extra key that
// Validate rejects is left out, and a virtual local rank without a device gets
// CUDA_VISIBLE_DEVICES="" (no GPU rather than someone else's).
func (e Env) Environ() []string {
	env := newEnviron(e.Base)
	localRank := e.LocalRank
	if e.VirtualLocalRank {
		localRank = 0
		device, _ := e.virtualDevice()
		env.set("CUDA_VISIBLE_DEVICES", device)
	}
	env.set("LOCAL_RANK", strconv.Itoa(localRank))
	env.set("RANK", strconv.Itoa(e.Rank))
	env.set("GROUP_RANK", strconv.Itoa(e.GroupRank))
	env.set("ROLE_RANK", strconv.Itoa(e.RoleRank))
	env.set("ROLE_NAME", e.RoleName)
	env.set("ROLE_WORLD_SIZE", strconv.Itoa(e.RoleWorldSize))
	env.set("LOCAL_WORLD_SIZE", strconv.Itoa(e.LocalWorldSize))
	env.set("WORLD_SIZE", strconv.Itoa(e.WorldSize))
	env.set("GROUP_WORLD_SIZE", strconv.Itoa(e.GroupWorldSize))
	env.set("MASTER_ADDR", e.MasterAddr)
	env.set("MASTER_PORT", strconv.Itoa(e.MasterPort))
	env.set("TORCHELASTIC_RESTART_COUNT", strconv.Itoa(e.RestartCount))
	env.set("TORCHELASTIC_MAX_RESTARTS", strconv.Itoa(e.MaxRestarts))
	env.set("TORCHELASTIC_RUN_ID", e.RunID)
	env.set("TORCHELASTIC_USE_AGENT_STORE", pythonBool(e.UseAgentStore))
	if e.ErrorFile != "" {
		env.set("TORCHELASTIC_ERROR_FILE", e.ErrorFile)
	}
	// Many workers on one node each spawning a thread per core oversubscribe
	// the CPUs; torchrun defaults to one OpenMP thread and so do we.
	if e.LocalWorldSize > 1 {
		env.setDefault("OMP_NUM_THREADS", "1")
	}
	// torch 2.x reads the TORCH_ name, torch 1.13 the bare one.
	env.setDefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
	env.setDefault("NCCL_ASYNC_ERROR_HANDLING", "1")
	if e.Python {
		env.setDefault("PYTHONUNBUFFERED", "1")
	}
	for _, key := range slices.Sorted(maps.Keys(e.Extra)) {
		if validExtraKey(key) {
			env.set(key, e.Extra[key])
		}
	}
	return env.kv
}

// virtualDevice is the one device a virtual-local-rank worker may see.
func (e Env) virtualDevice() (string, bool) {
	parent, ok := newEnviron(e.Base).lookup("CUDA_VISIBLE_DEVICES")
	if !ok {
		return strconv.Itoa(e.LocalRank), true
	}
	devices := strings.Split(parent, ",")
	if e.LocalRank < 0 || e.LocalRank >= len(devices) {
		return "", false
	}
	return strings.TrimSpace(devices[e.LocalRank]), true
}

func (e Env) lookupBase(key string) string {
	value, _ := newEnviron(e.Base).lookup(key)
	return value
}

func validExtraKey(key string) bool {
	return len(key) > len(ExtraPrefix) && strings.HasPrefix(key, ExtraPrefix) &&
		!strings.ContainsAny(key, "=\x00")
}

func pythonBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// environ is an ordered "KEY=value" list with at most one entry per key.
type environ struct {
	kv    []string
	index map[string]int // key → position in kv
}

// newEnviron copies base; when base repeats a key, the last value wins (as
// it does for getenv) but keeps the first position.
func newEnviron(base []string) *environ {
	size := len(base) + 24 // room for the contract's variables
	env := &environ{kv: make([]string, 0, size), index: make(map[string]int, size)}
	for _, entry := range base {
		key, _, _ := strings.Cut(entry, "=")
		env.put(key, entry)
	}
	return env
}

func (env *environ) set(key, value string) { env.put(key, key+"="+value) }

// setDefault sets key only when it is absent: the agent's value is inherited.
func (env *environ) setDefault(key, value string) {
	if _, ok := env.index[key]; !ok {
		env.set(key, value)
	}
}

func (env *environ) put(key, entry string) {
	if i, ok := env.index[key]; ok {
		env.kv[i] = entry
		return
	}
	env.index[key] = len(env.kv)
	env.kv = append(env.kv, entry)
}

func (env *environ) lookup(key string) (string, bool) {
	i, ok := env.index[key]
	if !ok {
		return "", false
	}
	_, value, _ := strings.Cut(env.kv[i], "=")
	return value, true
}

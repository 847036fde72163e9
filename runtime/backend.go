package runtime

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/cuda"
	"github.com/gorun/gorun/rendezvous"
	"github.com/rs/zerolog"
)

// Choosing the backend. Every group has the TCP (and shared-memory)
// communicators, which carry host tensors. With NCCL it also has NCCL
// communicators on this process's GPU, which carry device tensors, as
// torch's "cpu:gloo,cuda:nccl" does; without, device tensors are staged
// through host memory over TCP.

// BackendEnv names the variable that chooses the backend when WithBackend
// does not: "auto" (the default), "nccl" or "tcp".
const BackendEnv = "GORUN_BACKEND"

// The backends.
const (
	backendAuto = "auto" // NCCL when every rank can run it, else TCP
	backendNCCL = "nccl" // NCCL or an error
	backendTCP  = "tcp"  // TCP only; Init touches no GPU
)

// backendName is the backend WithBackend or BackendEnv asks for.
func (c *config) backendName() (string, error) {
	if c.backend != "" {
		return c.checkBackend(c.backend, fmt.Sprintf("backend %q", c.backend))
	}
	name, _ := c.lookupEnv(BackendEnv)
	if name == "" {
		return backendAuto, nil
	}
	return c.checkBackend(name, fmt.Sprintf("%s=%s", BackendEnv, name))
}

func (c *config) checkBackend(name, given string) (string, error) {
	switch name {
	case backendAuto, backendNCCL, backendTCP:
		return name, nil
	}
	return "", fmt.Errorf("runtime: unknown %s: want auto, tcp or nccl", given)
}

// gpu is this process's GPU, opened by Init, and NCCL when it loaded.
type gpu struct {
	dev  *cuda.Device
	nccl *cuda.NCCL // nil when NCCL did not load
}

// gpuState is what a rank tells the others about its GPU, so that they
// all take the same backend.
type gpuState int64

const (
	gpuReady  gpuState = iota // a GPU, and NCCL loaded
	gpuAbsent                 // no CUDA driver, or no GPU
	gpuBroken                 // a GPU, but NCCL cannot run: the rank's error says why
)

// openGPU opens this process's GPU (see openDevice) and loads NCCL. It
// returns what it opened, what that makes of this rank, and why it is not
// ready. The GPU's Close is added to release.
func (c *config) openGPU(ctx context.Context, backend string, env launchEnv, release *cleanups) (*gpu, gpuState, error) {
	driverSearch := cuda.Search{LookupEnv: c.lookupEnv}
	if backend == backendAuto {
		// The driver comes with the kernel driver, on the loader's path,
		// not in a Python wheel; asking python3 for its site-packages would
		// cost every worker of a machine without a GPU a process start.
		driverSearch.SitePackages = func(context.Context) ([]string, error) { return nil, nil }
	}
	dev, state, err := openDevice(ctx, driverSearch, env.localRank)
	if err != nil {
		return nil, state, err
	}
	release.add(dev.Close)
	g := &gpu{dev: dev}
	g.nccl, err = cuda.LoadNCCL(ctx, cuda.Search{LookupEnv: c.lookupEnv})
	if err != nil {
		return g, gpuBroken, err
	}
	return g, gpuReady, nil
}

// openDevice opens the localRank-th GPU modulo the GPUs the driver found
// through search sees, so that ranks outnumbering GPUs share them, which
// the TCP backend allows. On failure, the state says whether the rank has
// no GPU or a broken one.
func openDevice(ctx context.Context, search cuda.Search, localRank int) (*cuda.Device, gpuState, error) {
	drv, err := cuda.LoadDriver(ctx, search)
	if err != nil {
		return nil, gpuAbsent, err
	}
	count, err := drv.DeviceCount()
	if err == nil && count == 0 {
		err = fmt.Errorf("cuda: the driver %s sees no GPU", drv.Path())
	}
	if err != nil {
		return nil, gpuAbsent, err
	}
	dev, err := drv.OpenDevice(localRank % count)
	if err != nil {
		return nil, gpuBroken, err
	}
	return dev, gpuReady, nil
}

// placeKey identifies a GPU among the job's as NCCL's own check for
// duplicates does: its host (as NCCL_HOSTID names it, when set, else the
// host name) and its PCI address. Ranks with the same key share a GPU,
// which NCCL refuses (and, when some of a communicator's ranks do and
// others do not, the others hang in its init).
func (c *config) placeKey(dev *cuda.Device) int64 {
	host, ok := c.lookupEnv("NCCL_HOSTID")
	if !ok {
		host, _ = os.Hostname()
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s", host, dev.BusID())
	return int64(h.Sum64())
}

// shareStates gathers every rank's state and GPU key over comm.
func shareStates(ctx context.Context, comm collective.Comm, state gpuState, key int64) ([]gpuState, []int64, error) {
	mine := []int64{int64(state), key}
	all := make([]int64, 2*comm.Size())
	if err := comm.AllGather(ctx, Of(all).data, Of(mine).data, Int64); err != nil {
		return nil, nil, err
	}
	states, keys := make([]gpuState, comm.Size()), make([]int64, comm.Size())
	for r := range states {
		states[r], keys[r] = gpuState(all[2*r]), all[2*r+1]
	}
	return states, keys, nil
}

// A verdict is what the ranks' states mean for NCCL, seen from one rank.
type verdict struct {
	use    bool  // every rank can run NCCL
	noGPUs bool  // no rank has a GPU: nothing worth a warning
	why    error // why not NCCL
}

// judge reads the states and keys every rank shared; mine is why this
// rank is not ready, if it is not.
func judge(rank int, states []gpuState, keys []int64, mine error) verdict {
	var unready, sharing []int
	for r, s := range states {
		switch {
		case s != gpuReady:
			unready = append(unready, r)
		case slices.Contains(keys[:r], keys[r]) || slices.Contains(keys[r+1:], keys[r]):
			sharing = append(sharing, r)
		}
	}
	switch {
	case len(unready) == 0 && len(sharing) == 0:
		return verdict{use: true}
	case !slices.ContainsFunc(states, func(s gpuState) bool { return s != gpuAbsent }):
		return verdict{noGPUs: true, why: mine}
	case states[rank] != gpuReady:
		return verdict{why: mine}
	case slices.Contains(sharing, rank):
		var mates []int
		for _, r := range sharing {
			if keys[r] == keys[rank] {
				mates = append(mates, r)
			}
		}
		return verdict{why: fmt.Errorf("ranks %v share one GPU of this host, and NCCL needs a GPU per rank", mates)}
	}
	bad := slices.Sorted(slices.Values(append(unready, sharing...)))
	return verdict{why: fmt.Errorf("ranks %v cannot use NCCL (they say why)", bad)}
}

// settle acts on a verdict against NCCL: the nccl backend fails; auto
// says why in one log line, a warning unless no rank has a GPU, and goes
// on with TCP.
func settle(backend string, rank int, v verdict, log zerolog.Logger) error {
	if backend == backendNCCL {
		return fmt.Errorf("runtime: backend nccl on rank %d: %w", rank, v.why)
	}
	if v.noGPUs {
		log.Debug().Err(v.why).Msg("no GPU: using the TCP backend")
	} else {
		log.Warn().Err(v.why).Msg("NCCL is unavailable: using the TCP backend")
	}
	return nil
}

// startNCCL opens the GPU, agrees with the other ranks over comm, the
// world's host communicator, on whether all can run NCCL, and if so makes
// the world's NCCL communicators, meeting through store. It returns the
// GPU, if this process has one, even when the job goes on with TCP.
func (c *config) startNCCL(ctx context.Context, backend string, env launchEnv, store rendezvous.Store, comm collective.Comm, log zerolog.Logger, release *cleanups) (*gpu, *ncclComms, error) {
	g, state, whyNot := c.openGPU(ctx, backend, env, release)
	var key int64
	if g != nil {
		key = c.placeKey(g.dev)
	}
	states, keys, err := shareStates(ctx, comm, state, key)
	if err != nil {
		return nil, nil, fmt.Errorf("runtime: rank %d: agreeing on a backend: %w", env.rank, err)
	}
	if v := judge(env.rank, states, keys, whyNot); !v.use {
		return g, nil, settle(backend, env.rank, v, log)
	}

	comms, whyNot := newWorldComms(ctx, g, store, env.rank, env.worldSize, c.timeout)
	state = gpuReady
	if whyNot != nil {
		state = gpuBroken
	}
	states, _, err = shareStates(ctx, comm, state, 0)
	if err == nil {
		v := judge(env.rank, states, distinct(len(states)), whyNot)
		if v.use {
			log.Debug().Int("gpu", g.dev.Ordinal()).Str("nccl", g.nccl.Version().String()).Msg("using the NCCL backend")
			return g, comms, nil
		}
		err = settle(backend, env.rank, v, log)
	} else {
		err = fmt.Errorf("runtime: rank %d: agreeing on a backend: %w", env.rank, err)
	}
	if comms != nil {
		err = errors.Join(err, comms.close())
	}
	return g, nil, err
}

// distinct returns n keys that differ, for a judgement of states alone.
func distinct(n int) []int64 {
	keys := make([]int64, n)
	for i := range keys {
		keys[i] = int64(i)
	}
	return keys
}

// ncclKey is where a group's NCCL unique id goes in the job's store.
func ncclKey(groupID string) string { return "nccl/" + groupID }

// failedID is what rank 0 leaves in place of the unique id when it could
// not make one, so that the other ranks fail at once instead of waiting
// out their timeout for it.
var failedID = []byte("rank 0 failed")

// failedIDTimeout bounds rank 0's note of its failure.
const failedIDTimeout = 10 * time.Second

// newWorldComms makes the world's NCCL communicators.
func newWorldComms(ctx context.Context, g *gpu, store rendezvous.Store, rank, size int, timeout time.Duration) (*ncclComms, error) {
	key := ncclKey(worldID)
	coll, err := g.nccl.NewComm(ctx, g.dev, cuda.CommConfig{Rank: rank, Size: size, Store: store, Key: key, Timeout: timeout})
	if err != nil {
		if rank == 0 {
			noteCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), failedIDTimeout)
			defer cancel()
			err = errors.Join(err, store.Set(noteCtx, key, failedID))
		}
		return nil, err
	}
	return withMessages(ctx, coll, size)
}

// ncclComms are a group's NCCL communicators on this process's GPU, each
// with its own CUDA stream: one for collectives and one for
// point-to-point messages, kept apart as on the host side.
type ncclComms struct {
	coll, p2p *cuda.Comm
}

// collectives returns the communicator for collectives; nil without NCCL.
func (n *ncclComms) collectives() *cuda.Comm {
	if n == nil {
		return nil
	}
	return n.coll
}

// messages returns the communicator for point-to-point messages; nil
// without NCCL.
func (n *ncclComms) messages() *cuda.Comm {
	if n == nil {
		return nil
	}
	return n.p2p
}

// split makes the communicators of the ranks members of n, in that order,
// through ncclCommSplit where NCCL has it. Every rank of n calls it; one
// not listed gets nil.
func (n *ncclComms) split(ctx context.Context, members []int, id string) (*ncclComms, error) {
	coll, err := n.coll.Split(ctx, members, id)
	if err != nil || coll == nil {
		return nil, err
	}
	return withMessages(ctx, coll, len(members))
}

// withMessages makes the communicator for point-to-point messages beside
// coll, the one for collectives of size ranks, and returns the pair; it
// closes coll when it fails.
func withMessages(ctx context.Context, coll *cuda.Comm, size int) (*ncclComms, error) {
	p2p, err := coll.Split(ctx, everyRank(size), "p2p")
	if err != nil {
		return nil, errors.Join(err, coll.Close())
	}
	return &ncclComms{coll: coll, p2p: p2p}, nil
}

// close destroys the communicators, in the same order on every rank.
func (n *ncclComms) close() error {
	if n == nil {
		return nil
	}
	return errors.Join(n.p2p.Close(), n.coll.Close())
}

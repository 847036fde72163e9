package runtime

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/cuda"
	"github.com/rs/zerolog"
)

// ProcessGroup is a set of ranks and the operations among them: torch's
// ProcessGroup. Init returns the group of every rank (the world);
// NewGroup, Split and NewDeviceMesh carve groups out of it. Ranks given
// to and returned by a group's methods are ranks within that group, from
// 0 to Size()-1; GlobalRank and GroupRank translate.
//
// A group's collectives run one at a time, in call order, on a goroutine
// of the group's own, and the asynchronous forms return at once with a
// Work. Every rank must call the group's collectives in the same order.
// Groups are independent: collectives on different groups may run
// concurrently. But a goroutine waiting in one group's collective joins
// no other meanwhile, so ranks whose code waits on several groups in turn
// must do so in a consistent order, as with NCCL. Point-to-point messages
// bypass the queue (see Send).
//
// The methods are safe for concurrent use, but collectives issued
// concurrently on one group run in an unspecified order, which the other
// ranks are unlikely to match.
type ProcessGroup struct {
	id    string // unique in the job; Comm.Split ids derive from it
	ranks []int  // global rank of each group rank
	rank  int    // this process's group rank; -1 when not a member
	job   *job   // what every group of the job shares
	log   zerolog.Logger

	// Members only: collectives run on comm through exec, point-to-point
	// messages on p2p through lanes. Two communicators keep the two apart,
	// which a Comm requires. With NCCL, nccl carries device tensors the
	// same way; it is nil on TCP.
	comm  collective.Comm
	p2p   collective.Comm
	nccl  *ncclComms
	exec  *executor
	lanes *lanes
	stop  context.CancelCauseFunc // ends the scope of exec and lanes

	children int // groups split off so far; touched only by exec's goroutine

	// counts and staging are the scratch of the calls runInline runs
	// (inlineCounts, inlineBytes).
	counts  []int
	staging [2][]byte

	mu        sync.Mutex
	subgroups []*ProcessGroup // closed with this group
	closing   bool            // Close has begun: subgroups adopted later close at once

	close func() error // once
}

// job is what the groups of one Init share.
type job struct {
	localRank, localWorldSize int
	timeout                   time.Duration
	log                       zerolog.Logger
	release                   func() error // store client, hosted store server, GPU
	progress                  *progress    // nil unless the launcher watches
	backend                   string       // backendNCCL or backendTCP
	gpu                       *gpu         // nil when Init opened none
	// asked is the GPU OpenDevice opened when Init had not (tcp), found
	// with gpuSearch; the world's Close closes it.
	gpuSearch cuda.Search
	askedMu   sync.Mutex
	asked     *cuda.Device
}

// newMember returns the group of ranks whose communicators are comm and
// p2p, and nccl, nil without NCCL.
func newMember(j *job, id string, ranks []int, comm, p2p collective.Comm, nccl *ncclComms) *ProcessGroup {
	life, stop := context.WithCancelCause(context.Background())
	s := scope{life: life, timeout: j.timeout, progress: j.progress}
	pg := &ProcessGroup{
		id: id, ranks: ranks, rank: comm.Rank(), job: j,
		log:  j.log.With().Str("group", id).Logger(),
		comm: comm, p2p: p2p, nccl: nccl,
		exec: newExecutor(s), lanes: newLanes(s), stop: stop,
	}
	pg.close = sync.OnceValue(pg.shutdown)
	return pg
}

// newNonMember returns the group of ranks, seen from a process outside it.
func newNonMember(j *job, id string, ranks []int) *ProcessGroup {
	pg := &ProcessGroup{id: id, ranks: ranks, rank: -1, job: j, log: j.log.With().Str("group", id).Logger()}
	pg.close = sync.OnceValue(pg.shutdown)
	return pg
}

// IsMember reports whether this process belongs to the group.
func (pg *ProcessGroup) IsMember() bool { return pg.comm != nil }

// Rank returns this process's rank in the group, or -1 when it is not a
// member.
func (pg *ProcessGroup) Rank() int { return pg.rank }

// Size returns the number of ranks in the group: 0 for the group a
// negative color gives in Split, which has none.
func (pg *ProcessGroup) Size() int { return len(pg.ranks) }

// Ranks returns the global rank of every group rank, in group rank order.
func (pg *ProcessGroup) Ranks() []int { return slices.Clone(pg.ranks) }

// GlobalRank returns the global rank of groupRank, or -1 when groupRank is
// out of range.
func (pg *ProcessGroup) GlobalRank(groupRank int) int {
	if groupRank < 0 || groupRank >= len(pg.ranks) {
		return -1
	}
	return pg.ranks[groupRank]
}

// GroupRank returns the rank in the group of the process whose global
// rank is globalRank, and whether it belongs to the group.
func (pg *ProcessGroup) GroupRank(globalRank int) (int, bool) {
	i := slices.Index(pg.ranks, globalRank)
	return i, i >= 0
}

// LocalRank returns this process's rank among the workers of its node
// (LOCAL_RANK), the same for every group.
func (pg *ProcessGroup) LocalRank() int { return pg.job.localRank }

// LocalWorldSize returns the number of workers on this process's node
// (LOCAL_WORLD_SIZE).
func (pg *ProcessGroup) LocalWorldSize() int { return pg.job.localWorldSize }

// Timeout returns the time each operation of the group may take.
func (pg *ProcessGroup) Timeout() time.Duration { return pg.job.timeout }

// Backend returns what carries the group's device tensors: "nccl", or
// "tcp", which stages them through host memory. Host tensors always
// travel over TCP and shared memory.
func (pg *ProcessGroup) Backend() string { return pg.job.backend }

// Device returns this process's GPU, which Init opened unless the backend
// is "tcp" or there is none (nil then). With NCCL, the group's device
// tensors must be on it. It is the job's: Close of the group Init
// returned closes it.
func (pg *ProcessGroup) Device() *cuda.Device {
	j := pg.job
	j.askedMu.Lock()
	defer j.askedMu.Unlock()
	return j.device()
}

// OpenDevice returns this process's GPU as Device does, opening it when
// Init did not: the "tcp" backend leaves the GPU alone until a program
// asks for it here, to stage device tensors through host memory. It is the
// LOCAL_RANK-th GPU, modulo the GPUs the driver sees, and the job's: Close
// of the group Init returned closes it.
func (pg *ProcessGroup) OpenDevice(ctx context.Context) (*cuda.Device, error) {
	j := pg.job
	j.askedMu.Lock()
	defer j.askedMu.Unlock()
	if dev := j.device(); dev != nil {
		return dev, nil
	}
	dev, _, err := openDevice(ctx, j.gpuSearch, j.localRank)
	if err != nil {
		return nil, fmt.Errorf("runtime: open a GPU: %w", err)
	}
	j.asked = dev
	return dev, nil
}

// device returns the job's GPU: Init's, else the one OpenDevice opened,
// else nil. The caller holds askedMu.
func (j *job) device() *cuda.Device {
	if j.gpu != nil {
		return j.gpu.dev
	}
	return j.asked
}

func (pg *ProcessGroup) String() string {
	return fmt.Sprintf("ProcessGroup(%s, rank %d of %d)", pg.id, pg.rank, len(pg.ranks))
}

// Close fails the group's pending operations with ErrClosed and releases
// it with every group split off it; closing the group Init returned also
// releases the store and the store server this process hosts. Close may
// be called more than once, and on a nil group; later calls return the
// first one's result.
func (pg *ProcessGroup) Close() error {
	if pg == nil {
		return nil
	}
	return pg.close()
}

// shutdown is Close's body: subgroups first, then this group's operations
// and communicators, then what the job shares. Every rank closes NCCL
// communicators in the same order, children before parents, since
// destroying one may wait for its peers.
func (pg *ProcessGroup) shutdown() error {
	pg.mu.Lock()
	subgroups := pg.subgroups
	pg.subgroups, pg.closing = nil, true
	pg.mu.Unlock()

	var errs []error
	for _, sub := range slices.Backward(subgroups) {
		errs = append(errs, sub.Close())
	}
	if pg.IsMember() {
		pg.stop(ErrClosed)
		pg.exec.close()
		// Closing the communicators fails the calls in progress, which
		// the queue's goroutine and the lanes are waiting for.
		errs = append(errs, pg.comm.Close(), pg.p2p.Close())
		pg.exec.wait()
		pg.lanes.wait()
		// NCCL's operations, cancelled, have returned; their
		// communicators go last, as the GPU must be done with them.
		errs = append(errs, pg.nccl.close())
	}
	if pg.id == worldID {
		if pg.job.release != nil {
			errs = append(errs, pg.job.release())
		}
		pg.job.askedMu.Lock()
		if pg.job.asked != nil {
			errs = append(errs, pg.job.asked.Close())
		}
		pg.job.askedMu.Unlock()
	}
	return errors.Join(errs...)
}

// worldID names the group Init returns.
const worldID = "0"

// collective queues run on the group, once check (which may be nil)
// accepts the arguments: they are checked before anything is queued, so
// that a local mistake fails fast instead of leaving the other ranks
// waiting in a collective this one never joins.
func (pg *ProcessGroup) collective(ctx context.Context, op string, check func() error, run func(ctx context.Context) error) *Work {
	if err := pg.admit(check); err != nil {
		return failedWork(op, err)
	}
	return pg.exec.submit(newWork(ctx, op, run))
}

// runInline runs a blocking collective's host form, run, on the
// caller's goroutine, when its tensors are on the host (onDevice false),
// check accepts its arguments and nothing is queued on the group (see
// executor.runInline); it reports whether it did. Otherwise the caller
// queues the operation, which fails there as it would have here.
func (pg *ProcessGroup) runInline(ctx context.Context, op string, d opDesc, onDevice bool, check func() error, run func(context.Context) error) (bool, error) {
	if onDevice || pg.admit(check) != nil {
		return false, nil
	}
	ran, err := pg.exec.runInline(ctx, op, d, run)
	if err != nil {
		err = &OpError{Op: op, Err: err}
	}
	return ran, err
}

// admit refuses an operation of a non-member with ErrNotMember, and one
// whose check fails with the check's error.
func (pg *ProcessGroup) admit(check func() error) error {
	if !pg.IsMember() {
		return ErrNotMember
	}
	if check == nil {
		return nil
	}
	return check()
}

// NewGroup creates the group of the given global ranks, as torch's
// new_group does: every rank of pg calls it with the same ranks (their
// order does not matter: group ranks follow global ranks, as in torch),
// those listed get the group and the others a group whose IsMember is
// false. Ranks that passed different lists all get an error wrapping
// collective.ErrMismatch.
func (pg *ProcessGroup) NewGroup(ctx context.Context, ranks []int) (*ProcessGroup, error) {
	ranks = slices.Sorted(slices.Values(ranks))
	var group *ProcessGroup
	err := pg.collective(ctx, "new_group", nil, func(ctx context.Context) error {
		if err := pg.agree(ctx, ranks); err != nil {
			return err
		}
		members, err := pg.groupRanks(ranks)
		if err != nil {
			return err
		}
		group, err = pg.partition(ctx, [][]int{members})
		return err
	}).Wait(ctx)
	if err != nil {
		// The operation may still be running: leave group to it, and to
		// the Close of pg.
		return nil, err
	}
	return group, nil
}

// groupRanks translates sorted global ranks into pg's ranks, refusing
// duplicates and strangers.
func (pg *ProcessGroup) groupRanks(global []int) ([]int, error) {
	if len(global) == 0 {
		return nil, invalid("no ranks given")
	}
	local := make([]int, len(global))
	for i, g := range global {
		if i > 0 && g == global[i-1] {
			return nil, invalid("rank %d listed twice", g)
		}
		r, ok := pg.GroupRank(g)
		if !ok {
			return nil, invalid("rank %d is not in the parent group %v", g, pg.ranks)
		}
		local[i] = r
	}
	return local, nil
}

// Split partitions the group as MPI_Comm_split does: the ranks that pass
// the same color form a group, ordered by key, then by rank in pg; a rank
// that passes a negative color gets a group whose IsMember is false.
// Every rank of pg calls Split.
func (pg *ProcessGroup) Split(ctx context.Context, color, key int) (*ProcessGroup, error) {
	var group *ProcessGroup
	err := pg.collective(ctx, "split", nil, func(ctx context.Context) error {
		mine := []int64{int64(color), int64(key)}
		all := make([]int64, 2*pg.Size())
		if err := pg.comm.AllGather(ctx, Of(all).data, Of(mine).data, Int64); err != nil {
			return err
		}
		byColor := make(map[int64][]int)
		for r := range pg.Size() {
			if c := all[2*r]; c >= 0 {
				byColor[c] = append(byColor[c], r)
			}
		}
		var groups [][]int
		for _, c := range slices.Sorted(maps.Keys(byColor)) {
			members := byColor[c]
			slices.SortStableFunc(members, func(a, b int) int { return cmp.Compare(all[2*a+1], all[2*b+1]) })
			groups = append(groups, members)
		}
		var err error
		group, err = pg.partition(ctx, groups)
		return err
	}).Wait(ctx)
	if err != nil {
		return nil, err // as in NewGroup
	}
	return group, nil
}

// partition splits pg's communicator into groups, lists of pg's ranks in
// which this process appears at most once, and returns this process's
// group. It runs on pg's queue, as the communicator's calls must.
func (pg *ProcessGroup) partition(ctx context.Context, groups [][]int) (_ *ProcessGroup, err error) {
	var mine *ProcessGroup
	defer func() {
		if err != nil && mine != nil {
			mine.Close()
		}
	}()
	for _, members := range groups {
		pg.children++
		id := pg.id + "." + strconv.Itoa(pg.children)
		comm, err := pg.comm.Split(ctx, members, id)
		if err != nil {
			return nil, err
		}
		var nccl *ncclComms
		if pg.nccl != nil {
			// Every rank of pg takes part, members or not.
			if nccl, err = pg.nccl.split(ctx, members, id); err != nil {
				if comm != nil {
					comm.Close()
				}
				return nil, err
			}
		}
		if comm == nil {
			continue
		}
		p2p, err := comm.Split(ctx, everyRank(len(members)), "p2p")
		if err != nil {
			return nil, errors.Join(err, comm.Close(), nccl.close())
		}
		mine = newMember(pg.job, id, pg.globalRanks(members), comm, p2p, nccl)
	}
	if mine == nil {
		mine = newNonMember(pg.job, pg.id+".-", pg.ownGroupRanks(groups))
	}
	mine.log.Debug().Ints("ranks", mine.ranks).Bool("member", mine.IsMember()).Msg("group created")
	pg.adopt(mine)
	return mine, nil
}

// ownGroupRanks returns the global ranks of the only group when there is
// one, which a non-member may still ask about; with several groups, it
// belongs to none and there is no one group to describe.
func (pg *ProcessGroup) ownGroupRanks(groups [][]int) []int {
	if len(groups) != 1 {
		return nil
	}
	return pg.globalRanks(groups[0])
}

func (pg *ProcessGroup) globalRanks(groupRanks []int) []int {
	global := make([]int, len(groupRanks))
	for i, r := range groupRanks {
		global[i] = pg.ranks[r]
	}
	return global
}

// adopt makes Close of pg close sub too, or closes sub now if pg is
// closing already.
func (pg *ProcessGroup) adopt(sub *ProcessGroup) {
	pg.mu.Lock()
	closing := pg.closing
	if !closing {
		pg.subgroups = append(pg.subgroups, sub)
	}
	pg.mu.Unlock()
	if closing {
		sub.Close()
	}
}

// agree checks that every rank of pg passed the same arguments, comparing
// a digest of them, so that ranks that disagree all fail with an error
// instead of hanging in mismatched collectives. It runs on pg's queue.
func (pg *ProcessGroup) agree(ctx context.Context, args ...any) error {
	h := fnv.New64a()
	fmt.Fprintf(h, "%#v", args)
	mine := []int64{int64(h.Sum64())}
	all := make([]int64, pg.Size())
	if err := pg.comm.AllGather(ctx, Of(all).data, Of(mine).data, Int64); err != nil {
		return err
	}
	if !slices.ContainsFunc(all, func(d int64) bool { return d != all[0] }) {
		return nil
	}
	// Name the camps: the ranks that passed the same arguments.
	camps := make(map[int64][]int)
	var order []int64
	for r, d := range all {
		if camps[d] == nil {
			order = append(order, d)
		}
		camps[d] = append(camps[d], r)
	}
	described := make([]string, len(order))
	for i, d := range order {
		described[i] = fmt.Sprint(camps[d])
	}
	return fmt.Errorf("ranks passed different arguments (ranks %s): %w", strings.Join(described, " vs "), collective.ErrMismatch)
}

// everyRank returns 0, 1, ..., n-1.
func everyRank(n int) []int {
	ranks := make([]int, n)
	for i := range ranks {
		ranks[i] = i
	}
	return ranks
}

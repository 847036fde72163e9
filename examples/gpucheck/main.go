// Command gpucheck checks the runtime on a GPU: it runs every collective
// and message on device tensors and compares each result with the same
// operation on host tensors, the reference. Rank 0 prints one line per
// operation, PASS or FAIL, then a summary; every rank exits 1 when any
// operation failed on any rank.
//
//	gorun --nproc-per-node 1 bin/gpucheck -backend nccl -want nccl
//	gorun --nproc-per-node 4 bin/gpucheck -backend tcp -want tcp
//	gorun --nproc-per-node 2 bin/gpucheck -backend nccl -watchdog 5s
//
// With -watchdog, it checks the group's timeout instead: the last rank
// holds back from a collective, and the others must abort it (see
// checkWatchdog).
//
// With NCCL the device tensors are on the GPU Init opened; on the TCP
// backend on the one ProcessGroup.OpenDevice opens, the LOCAL_RANK-th
// modulo the GPUs there are, so several ranks may share one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gorun/gorun/cuda"
	dist "github.com/gorun/gorun/runtime"
	"github.com/rs/zerolog"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command, returning its exit status: 0 when every check
// passed, 1 when one failed or the job could not start, 2 for bad flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("gpucheck", flag.ContinueOnError)
	flags.SetOutput(stderr)
	backend := flags.String("backend", "", "backend: auto, nccl or tcp (default: $GORUN_BACKEND, else auto)")
	want := flags.String("want", "", "fail unless Init chose this backend for device tensors: nccl or tcp")
	n := flags.Int("n", 1<<20, "elements per tensor")
	watchdog := flags.Duration("watchdog", 0, "check instead that a collective the last rank holds back from is aborted after this group timeout")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *n < 16 {
		fmt.Fprintln(stderr, "gpucheck: -n must be at least 16")
		return 2
	}
	log := zerolog.New(zerolog.ConsoleWriter{Out: stderr, NoColor: true}).Level(zerolog.WarnLevel).With().Timestamp().Logger()
	opts := []dist.Option{dist.WithLogger(log)}
	if *backend != "" {
		opts = append(opts, dist.WithBackend(*backend))
	}
	check := func(pg *dist.ProcessGroup) error { return checkAll(ctx, pg, *want, *n, stdout, stderr) }
	if *watchdog > 0 {
		opts = append(opts, dist.WithTimeout(*watchdog))
		check = func(pg *dist.ProcessGroup) error { return checkWatchdog(ctx, pg, *watchdog, stdout, stderr) }
	}
	pg, err := dist.Init(ctx, opts...)
	if err != nil {
		fmt.Fprintln(stderr, "gpucheck:", err)
		dist.RecordError(err)
		return 1
	}
	defer pg.Close()
	if err := check(pg); err != nil {
		fmt.Fprintln(stderr, "gpucheck:", err)
		dist.RecordError(err)
		return 1
	}
	return 0
}

// checkAll runs every check and reports them on rank 0.
func checkAll(ctx context.Context, pg *dist.ProcessGroup, want string, n int, stdout, stderr io.Writer) error {
	if want != "" && pg.Backend() != want {
		return fmt.Errorf("the backend for device tensors is %s, want %s", pg.Backend(), want)
	}
	dev, err := pg.OpenDevice(ctx) // the TCP backend opens it when asked
	if err != nil {
		return err
	}
	say := func(format string, args ...any) {
		if pg.Rank() == 0 {
			fmt.Fprintf(stdout, format+"\n", args...)
		}
	}
	say("gpucheck: backend %s, %d ranks, GPU %d (%s), %d elements per tensor", pg.Backend(), pg.Size(), dev.Ordinal(), dev.Name(), n)
	checks := append(collectives(n), groupChecks(n)...)
	if pg.Size() > 1 {
		checks = append(checks, messages(n)...)
	}
	failed := 0
	for _, c := range checks {
		took, err := compare(ctx, pg, dev, c)
		if err != nil {
			fmt.Fprintf(stderr, "gpucheck: rank %d: %s: %v\n", pg.Rank(), c.name, err)
		}
		failing, serr := failingRanks(ctx, pg, err != nil)
		if serr != nil {
			return fmt.Errorf("sharing the result of %s: %w", c.name, serr)
		}
		if failing == 0 {
			say("PASS  %-36s %10.3f ms", c.name, float64(took.Microseconds())/1000)
		} else {
			failed++
			say("FAIL  %-36s on %d of %d ranks (their errors are above)", c.name, failing, pg.Size())
		}
	}
	say("gpucheck: %d of %d checks passed on backend %s", len(checks)-failed, len(checks), pg.Backend())
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed", failed, len(checks))
	}
	return nil
}

// failingRanks tells every rank how many ranks failed, over the host.
func failingRanks(ctx context.Context, pg *dist.ProcessGroup, failed bool) (int32, error) {
	failing := []int32{0}
	if failed {
		failing[0] = 1
	}
	err := pg.AllReduce(ctx, dist.Of(failing), dist.Sum)
	return failing[0], err
}

// A check is one operation, run on host tensors and on device copies of
// them. Outputs start as garbage, so an operation that does nothing fails.
type check struct {
	name string
	// run starts the operation on tensors that m makes, and returns its
	// Work and the tensors that hold its results on this rank.
	run func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor)
}

// compare runs c on the host and on dev, and compares the results; it
// returns how long the device run took.
func compare(ctx context.Context, pg *dist.ProcessGroup, dev *cuda.Device, c check) (time.Duration, error) {
	host, device := &maker{}, &maker{dev: dev}
	defer device.free()
	hostWait, want := c.run(pg, host)
	if err := hostWait(ctx); err != nil {
		return 0, fmt.Errorf("on host tensors: %w", err)
	}
	start := time.Now()
	deviceWait, got := c.run(pg, device)
	err := deviceWait(ctx)
	took := time.Since(start)
	if err = errors.Join(err, device.err); err != nil {
		return took, err
	}
	for i := range want {
		back, err := toHost(got[i])
		if err != nil {
			return took, err
		}
		if err := same(back, want[i]); err != nil {
			return took, fmt.Errorf("output %d: %w", i, err)
		}
	}
	return took, nil
}

// A maker makes tensors on the host or on a GPU from values; its first
// failure sticks, and empty tensors stand in after it.
type maker struct {
	dev *cuda.Device // nil: the host
	err error
	own []*cuda.DeviceBuffer
}

// tensor returns n elements of dt with values value(i), exact in every
// dtype when they are small integers.
func (m *maker) tensor(dt dist.DType, n int, value func(i int) float64) dist.Tensor {
	host := hostTensor(dt, n, value)
	if m.dev == nil || m.err != nil {
		return host
	}
	t, err := dist.NewDeviceTensor(m.dev, dt, n)
	if err == nil {
		m.own = append(m.own, t.DeviceBuffer())
		err = dist.Copy(t, host)
	}
	if err != nil {
		m.err = err
		return host
	}
	return t
}

// garbage is n elements that no result holds.
func (m *maker) garbage(dt dist.DType, n int) dist.Tensor {
	return m.tensor(dt, n, func(int) float64 { return -99 })
}

// list returns len(lengths) tensors, tensor k of lengths[k] elements of
// value(k, i); joined ones are consecutive slices of one tensor.
func (m *maker) list(dt dist.DType, lengths []int, joined bool, value func(k, i int) float64) []dist.Tensor {
	ts := make([]dist.Tensor, len(lengths))
	if !joined {
		for k, n := range lengths {
			ts[k] = m.tensor(dt, n, func(i int) float64 { return value(k, i) })
		}
		return ts
	}
	var owner []int // the piece of each element
	for k, n := range lengths {
		for range n {
			owner = append(owner, k)
		}
	}
	starts := make([]int, len(lengths)+1)
	for k, n := range lengths {
		starts[k+1] = starts[k] + n
	}
	whole := m.tensor(dt, len(owner), func(i int) float64 { return value(owner[i], i-starts[owner[i]]) })
	for k := range lengths {
		ts[k] = whole.Slice(starts[k], starts[k+1])
	}
	return ts
}

func (m *maker) free() {
	for _, b := range m.own {
		b.Free()
	}
}

// hostTensor returns n elements of dt with values value(i).
func hostTensor(dt dist.DType, n int, value func(i int) float64) dist.Tensor {
	switch dt {
	case dist.Int8:
		return fill[int8](n, value)
	case dist.Uint8:
		return fill[uint8](n, value)
	case dist.Int32:
		return fill[int32](n, value)
	case dist.Int64:
		return fill[int64](n, value)
	case dist.Float32:
		return fill[float32](n, value)
	case dist.Float64:
		return fill[float64](n, value)
	}
	bits := make([]uint16, n)
	for i := range bits {
		if dt == dist.Float16 {
			bits[i] = dist.ToFloat16(float32(value(i)))
		} else {
			bits[i] = dist.ToBFloat16(float32(value(i)))
		}
	}
	if dt == dist.Float16 {
		return dist.Float16s(bits)
	}
	return dist.BFloat16s(bits)
}

func fill[T dist.Elem](n int, value func(i int) float64) dist.Tensor {
	s := make([]T, n)
	for i := range s {
		s[i] = T(value(i))
	}
	return dist.Of(s)
}

// toHost copies t to a new host tensor.
func toHost(t dist.Tensor) (dist.Tensor, error) {
	if !t.OnDevice() {
		return t, nil
	}
	host := hostTensor(t.DType(), t.Len(), func(int) float64 { return 0 })
	return host, dist.Copy(host, t)
}

// same compares two host tensors: integers exactly, floating-point
// values within their type's precision, since NCCL may add in another
// order than the host does.
func same(got, want dist.Tensor) error {
	if got.DType() != want.DType() || got.Len() != want.Len() {
		return fmt.Errorf("%s, want %s", got, want)
	}
	g, w := values(got), values(want)
	tolerance := map[dist.DType]float64{dist.Float16: 1e-2, dist.BFloat16: 1e-2, dist.Float32: 1e-5, dist.Float64: 1e-12}[got.DType()]
	var bad []string
	for i := range w {
		if math.Abs(g[i]-w[i]) > tolerance*max(1, math.Abs(w[i])) {
			bad = append(bad, fmt.Sprintf("[%d] %v, want %v", i, g[i], w[i]))
			if len(bad) == 3 {
				break
			}
		}
	}
	if bad != nil {
		return fmt.Errorf("the GPU's result differs from the host's: %s", strings.Join(bad, "; "))
	}
	return nil
}

// values reads a host tensor as float64s.
func values(t dist.Tensor) []float64 {
	switch t.DType() {
	case dist.Int8:
		return widen(dist.Elems[int8](t))
	case dist.Uint8:
		return widen(dist.Elems[uint8](t))
	case dist.Int32:
		return widen(dist.Elems[int32](t))
	case dist.Int64:
		return widen(dist.Elems[int64](t))
	case dist.Float32:
		return widen(dist.Elems[float32](t))
	case dist.Float64:
		return widen(dist.Elems[float64](t))
	case dist.Float16:
		return halves(t.HalfBits(), dist.FromFloat16)
	case dist.BFloat16:
		return halves(t.HalfBits(), dist.FromBFloat16)
	}
	return make([]float64, t.Len())
}

// halves decodes 16-bit floats with from.
func halves(bits []uint16, from func(uint16) float32) []float64 {
	v := make([]float64, len(bits))
	for i, b := range bits {
		v[i] = float64(from(b))
	}
	return v
}

// widen converts numbers to float64s.
func widen[E int8 | uint8 | int32 | int64 | float32 | float64](s []E) []float64 {
	v := make([]float64, len(s))
	for i, x := range s {
		v[i] = float64(x)
	}
	return v
}

// pattern keeps every value a small integer, exact in every dtype after
// a sum over a few ranks.
func pattern(r, i int) float64 { return float64((r+i)%7 + 1) }

// collectives are the checks of every collective, each form of list.
func collectives(n int) []check {
	var checks []check
	for _, c := range []struct {
		op    dist.ReduceOp
		dt    dist.DType
		value func(r, i int) float64
	}{
		{dist.Sum, dist.Float32, pattern},
		{dist.Sum, dist.BFloat16, pattern},
		{dist.Sum, dist.Float16, pattern},
		{dist.Sum, dist.Int8, func(r, i int) float64 { return float64((r + i) % 5) }},
		{dist.Avg, dist.Float64, pattern},
		{dist.Max, dist.Int32, pattern},
		{dist.Min, dist.Int64, pattern},
		{dist.Product, dist.Float32, func(r, i int) float64 { return float64((r+i)%2 + 1) }},
	} {
		checks = append(checks, check{fmt.Sprintf("all_reduce %s %s", c.op, c.dt), func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			t := m.tensor(c.dt, n, func(i int) float64 { return c.value(pg.Rank(), i) })
			return pg.AllReduceAsync(t, c.op).Wait, []dist.Tensor{t}
		}})
	}
	checks = append(checks,
		check{"broadcast float32", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			t := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(pg.Rank(), i) })
			return pg.BroadcastAsync(t, pg.Size()-1).Wait, []dist.Tensor{t}
		}},
		check{"reduce float32", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			t := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(pg.Rank(), i) })
			w := pg.ReduceAsync(t, 0, dist.Sum)
			if pg.Rank() != 0 {
				return w.Wait, nil // left unspecified
			}
			return w.Wait, []dist.Tensor{t}
		}},
		check{"all_gather_into_tensor float32", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			in := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(pg.Rank(), i) })
			out := m.garbage(dist.Float32, n*pg.Size())
			return pg.AllGatherIntoAsync(out, in).Wait, []dist.Tensor{out}
		}},
		check{"reduce_scatter_tensor float32", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			in := m.tensor(dist.Float32, n*pg.Size(), func(i int) float64 { return pattern(pg.Rank(), i) })
			out := m.garbage(dist.Float32, n)
			return pg.ReduceScatterFromAsync(out, in, dist.Sum).Wait, []dist.Tensor{out}
		}},
		check{"all_to_all_single equal int32", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			in := m.tensor(dist.Int32, n*pg.Size(), func(i int) float64 { return float64(1000*pg.Rank() + i%1000) })
			out := m.garbage(dist.Int32, n*pg.Size())
			return pg.AllToAllSingleAsync(out, in, nil, nil).Wait, []dist.Tensor{out}
		}},
		check{"all_to_all_single uneven int64", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			rank, size := pg.Rank(), pg.Size()
			inSplits, outSplits := make([]int, size), make([]int, size)
			total := 0
			for peer := range size {
				inSplits[peer], outSplits[peer] = n/size+peer, n/size+rank
				total += inSplits[peer]
			}
			in := m.tensor(dist.Int64, total, func(i int) float64 { return float64(1000*rank + i%1000) })
			out := m.garbage(dist.Int64, size*(n/size+rank))
			return pg.AllToAllSingleAsync(out, in, outSplits, inSplits).Wait, []dist.Tensor{out}
		}},
	)
	for _, joined := range []bool{false, true} {
		how := map[bool]string{false: "separate", true: "joined"}[joined]
		checks = append(checks,
			check{"all_gather list " + how, func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
				in := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(pg.Rank(), i) })
				out := m.list(dist.Float32, slices.Repeat([]int{n}, pg.Size()), joined, func(int, int) float64 { return -99 })
				return pg.AllGatherAsync(out, in).Wait, out
			}},
			check{"gather list " + how, func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
				root := pg.Size() - 1
				in := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(pg.Rank(), i) })
				var out []dist.Tensor
				if pg.Rank() == root {
					out = m.list(dist.Float32, slices.Repeat([]int{n}, pg.Size()), joined, func(int, int) float64 { return -99 })
				}
				return pg.GatherAsync(out, in, root).Wait, out
			}},
			check{"scatter list " + how, func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
				var in []dist.Tensor
				if pg.Rank() == 0 {
					in = m.list(dist.Float32, slices.Repeat([]int{n}, pg.Size()), joined, pattern)
				}
				out := m.garbage(dist.Float32, n)
				return pg.ScatterAsync(out, in, 0).Wait, []dist.Tensor{out}
			}},
			check{"reduce_scatter list uneven " + how, func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
				lengths := make([]int, pg.Size())
				for k := range lengths {
					lengths[k] = n/pg.Size() + k
				}
				in := m.list(dist.Float32, lengths, joined, func(k, i int) float64 { return pattern(pg.Rank()+k, i) })
				out := m.garbage(dist.Float32, lengths[pg.Rank()])
				return pg.ReduceScatterAsync(out, in, dist.Sum).Wait, []dist.Tensor{out}
			}},
			check{"all_to_all list " + how, func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
				rank, size := pg.Rank(), pg.Size()
				in := m.list(dist.Int32, slices.Repeat([]int{n/size + rank}, size), joined, func(peer, i int) float64 { return float64(100*rank + peer + i%100) })
				lengths := make([]int, size)
				for peer := range lengths {
					lengths[peer] = n/size + peer
				}
				out := m.list(dist.Int32, lengths, joined, func(int, int) float64 { return -99 })
				return pg.AllToAllAsync(out, in).Wait, out
			}},
		)
	}
	return checks
}

// groupChecks run an all-reduce in groups split off the world, whose NCCL
// communicators come from ncclCommSplit.
func groupChecks(n int) []check {
	inGroup := func(name string, carve func(ctx context.Context, pg *dist.ProcessGroup) (*dist.ProcessGroup, error)) check {
		return check{name, func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			g, err := carve(context.Background(), pg)
			if err != nil || !g.IsMember() {
				return finished(err), nil
			}
			t := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(pg.Rank(), i) })
			return g.AllReduceAsync(t, dist.Sum).Wait, []dist.Tensor{t}
		}}
	}
	return []check{
		inGroup("new_group even ranks, all_reduce", func(ctx context.Context, pg *dist.ProcessGroup) (*dist.ProcessGroup, error) {
			var even []int
			for r := 0; r < pg.Size(); r += 2 {
				even = append(even, r)
			}
			return pg.NewGroup(ctx, even)
		}),
		inGroup("split by parity, all_reduce", func(ctx context.Context, pg *dist.ProcessGroup) (*dist.ProcessGroup, error) {
			return pg.Split(ctx, pg.Rank()%2, pg.Rank())
		}),
	}
}

// messages check point-to-point messages: pairs that send and receive
// in turn, and a ring both ways in one batch.
func messages(n int) []check {
	return []check{
		{"send/recv pairs", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			rank := pg.Rank()
			peer := rank ^ 1
			if peer >= pg.Size() {
				return finished(nil), nil // the odd one out
			}
			mine := m.tensor(dist.Float32, n, func(i int) float64 { return pattern(rank, i) })
			theirs := m.garbage(dist.Float32, n)
			// NCCL's sends wait for their receives: one side sends first.
			if rank%2 == 0 {
				return all(pg.ISend(mine, peer, 0), pg.IRecv(theirs, peer, 0)), []dist.Tensor{theirs}
			}
			return all(pg.IRecv(theirs, peer, 0), pg.ISend(mine, peer, 0)), []dist.Tensor{theirs}
		}},
		{"batch_isend_irecv ring", func(pg *dist.ProcessGroup, m *maker) (waiter, []dist.Tensor) {
			rank, size := pg.Rank(), pg.Size()
			next, prev := (rank+1)%size, (rank+size-1)%size
			fromPrev, fromNext := m.garbage(dist.Float32, n), m.garbage(dist.Float32, n/2)
			works := pg.BatchISendIRecv([]dist.P2POp{
				{Op: dist.SendOp, Tensor: m.tensor(dist.Float32, n, func(i int) float64 { return pattern(rank, i) }), Peer: next, Tag: 1},
				{Op: dist.SendOp, Tensor: m.tensor(dist.Float32, n/2, func(i int) float64 { return pattern(rank+3, i) }), Peer: prev, Tag: 2},
				{Op: dist.RecvOp, Tensor: fromPrev, Peer: prev, Tag: 1},
				{Op: dist.RecvOp, Tensor: fromNext, Peer: next, Tag: 2},
			})
			return all(works...), []dist.Tensor{fromPrev, fromNext}
		}},
	}
}

// A waiter waits for an operation and returns its error.
type waiter func(context.Context) error

// all waits for every one of works.
func all(works ...*dist.Work) waiter {
	return func(ctx context.Context) error {
		var errs []error
		for _, w := range works {
			errs = append(errs, w.Wait(ctx))
		}
		return errors.Join(errs...)
	}
}

// finished is the waiter of an operation that is over, with err.
func finished(err error) waiter { return func(context.Context) error { return err } }

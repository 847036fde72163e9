// Command allreduce-perf measures gorun's collectives the way nccl-tests'
// all_reduce_perf measures NCCL's, with the same flags, columns and bus
// bandwidth formulas, so the figures compare directly:
//
//	gorun --nproc-per-node 4 bin/allreduce-perf -b 8 -e 64M -f 2 -o allreduce -d float32
//
// One addition: -sizes runs a list of sizes instead of the -b/-e/-f
// progression, and -w and -n then take one count per size, so a single
// launch can give 8 bytes many iterations and 64 MiB a few:
//
//	allreduce-perf -sizes 8,1M,64M -w 20,3,2 -n 500,50,5
//
// -op picks the reduction of allreduce and reduce_scatter, as nccl-tests'
// --op does: sum, prod, max, min or avg.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	dist "github.com/gorun/gorun/runtime"
)

// collective is one benchmarked operation: how its buffers are laid out,
// how its bus bandwidth is derived, and what every rank must hold after it.
type collective struct {
	// reduces says the collective takes a reduction (-op); its redop column
	// then names it, and want is the reduction of every rank's input.
	reduces bool
	// busFactor turns algorithm bandwidth into bus bandwidth (nccl-tests'
	// formulas, n ranks).
	busFactor func(n float64) float64
	// run runs it once on buffers prepared by setup.
	run func(ctx context.Context, pg *dist.ProcessGroup, b *buffers, op dist.ReduceOp) error
	// inCount and outCount are the element counts per rank, for a total
	// of count elements (the size column).
	inCount, outCount func(count, n int) int
	// perRank collectives split count evenly over the ranks.
	perRank bool
	// input is the value of input element i on rank r; want is the value of
	// output element i on rank r after the operation, for a collective that
	// does not reduce. One that does names, with at, the input element that
	// output element i of rank r reduces over the ranks.
	input func(r, n, i, count int) float64
	want  func(r, n, i, count int) float64
	at    func(r, n, i, count int) int
}

// reduction is a -op: the operator, the inputs it is checked on (small
// integers, whose reductions over up to 8 ranks every dtype holds
// exactly), and how the expected output folds them.
type reduction struct {
	op    dist.ReduceOp
	input func(v float64) float64 // v: pattern's value, 1 to 7
	fold  func(acc, v float64) float64
	avg   bool // divide the fold by the number of ranks
}

var reductions = map[string]reduction{
	"sum": {op: dist.Sum, fold: func(acc, v float64) float64 { return acc + v }},
	// 2 where the pattern gives 7, which at most two of 8 ranks hold.
	"prod": {op: dist.Product, input: func(v float64) float64 { return 1 + float64(int(v)/7) }, fold: func(acc, v float64) float64 { return acc * v }},
	"max":  {op: dist.Max, fold: math.Max},
	"min":  {op: dist.Min, fold: math.Min},
	"avg":  {op: dist.Avg, fold: func(acc, v float64) float64 { return acc + v }, avg: true},
}

// value is what rank r holds at input element i under red.
func (red reduction) value(r, i int) float64 {
	v := pattern(r, i)
	if red.input != nil {
		v = red.input(v)
	}
	return v
}

// reduced is the reduction over n ranks of input element i.
func (red reduction) reduced(n, i int) float64 {
	acc := red.value(0, i)
	for s := 1; s < n; s++ {
		acc = red.fold(acc, red.value(s, i))
	}
	if red.avg {
		acc /= float64(n)
	}
	return acc
}

// buffers are one rank's input and output, in host or device memory.
type buffers struct {
	in, out dist.Tensor
	release []func() // unmaps host buffers on huge pages
}

// newBuffers allocates in and out elements of dt, on this rank's GPU when
// onDevice, else in host memory (host).
func newBuffers(pg *dist.ProcessGroup, onDevice, huge bool, dt dist.DType, in, out int) (buffers, error) {
	if !onDevice {
		var b buffers
		b.in, b.out = b.host(dt, in, huge), b.host(dt, out, huge)
		return b, nil
	}
	dev, err := pg.OpenDevice(context.Background())
	if err != nil {
		return buffers{}, err
	}
	var b buffers
	if b.in, err = dist.NewDeviceTensor(dev, dt, in); err == nil && out > 0 {
		b.out, err = dist.NewDeviceTensor(dev, dt, out)
	}
	if err != nil {
		b.free()
	}
	return b, err
}

// host allocates n elements of dt in host memory. From hugeMin bytes on,
// when huge, they are on transparent huge pages, as numpy allocates its
// arrays, so that gorun's buffers and the anchors' are the same kind of
// memory (it matters where the kernel copies between processes: a
// 16 MiB all_reduce of 2 ranks in shared memory took 2.4 ms on small
// pages, 1.8 on huge ones); else, or where the kernel has none, they are
// the Go heap's.
func (b *buffers) host(dt dist.DType, n int, huge bool) dist.Tensor {
	if huge && n*dt.Size() >= hugeMin {
		if mem, release, err := allocHuge(n * dt.Size()); err == nil {
			b.release = append(b.release, release)
			return tensorOver(dt, mem)
		}
	}
	return newTensor(dt, n)
}

// free releases device memory and huge pages; other host buffers are the
// garbage collector's.
func (b buffers) free() {
	for _, t := range []dist.Tensor{b.in, b.out} {
		if t.OnDevice() {
			t.DeviceBuffer().Free()
		}
	}
	for _, release := range b.release {
		release()
	}
}

// fillInput sets this rank's input to its pattern. The timed calls run on
// it too, not on zeros, as the anchors' on numpy's ones: a kernel may
// take back huge pages that hold only zeros, and the next write into
// them faults a fresh one in (a fifth of a 16 MiB all_reduce's time).
func fillInput(pg *dist.ProcessGroup, op collective, red reduction, b *buffers, count int) error {
	r, n := pg.Rank(), pg.Size()
	in := newTensor(b.in.DType(), b.in.Len())
	for i := 0; i < in.Len(); i++ {
		if op.reduces {
			set(in, i, red.value(r, i))
		} else {
			set(in, i, op.input(r, n, i, count))
		}
	}
	return dist.Copy(b.in, in)
}

// pattern keeps every value a small integer, exact in every dtype after a
// sum over up to 8 ranks, so a check can compare for equality.
func pattern(r, i int) float64 { return float64((r+i)%7 + 1) }

var collectives = map[string]collective{
	"allreduce": {
		reduces:   true,
		busFactor: func(n float64) float64 { return 2 * (n - 1) / n },
		run: func(ctx context.Context, pg *dist.ProcessGroup, b *buffers, op dist.ReduceOp) error {
			return pg.AllReduce(ctx, b.in, op)
		},
		inCount:  func(count, n int) int { return count },
		outCount: func(count, n int) int { return 0 },
		at:       func(r, n, i, count int) int { return i },
	},
	"broadcast": {
		busFactor: func(n float64) float64 { return 1 },
		run: func(ctx context.Context, pg *dist.ProcessGroup, b *buffers, _ dist.ReduceOp) error {
			return pg.Broadcast(ctx, b.in, 0)
		},
		inCount:  func(count, n int) int { return count },
		outCount: func(count, n int) int { return 0 },
		input:    func(r, n, i, count int) float64 { return pattern(r, i) },
		want:     func(r, n, i, count int) float64 { return pattern(0, i) },
	},
	"allgather": {
		perRank:   true,
		busFactor: func(n float64) float64 { return (n - 1) / n },
		run: func(ctx context.Context, pg *dist.ProcessGroup, b *buffers, _ dist.ReduceOp) error {
			return pg.AllGatherInto(ctx, b.out, b.in)
		},
		inCount:  func(count, n int) int { return count / n },
		outCount: func(count, n int) int { return count / n * n },
		input:    func(r, n, i, count int) float64 { return pattern(r, i) },
		want: func(r, n, i, count int) float64 {
			per := count / n
			return pattern(i/per, i%per)
		},
	},
	"reduce_scatter": {
		perRank:   true,
		reduces:   true,
		busFactor: func(n float64) float64 { return (n - 1) / n },
		run: func(ctx context.Context, pg *dist.ProcessGroup, b *buffers, op dist.ReduceOp) error {
			return pg.ReduceScatterFrom(ctx, b.out, b.in, op)
		},
		inCount:  func(count, n int) int { return count / n * n },
		outCount: func(count, n int) int { return count / n },
		at:       func(r, n, i, count int) int { return r*(count/n) + i },
	},
	"alltoall": {
		perRank:   true,
		busFactor: func(n float64) float64 { return (n - 1) / n },
		run: func(ctx context.Context, pg *dist.ProcessGroup, b *buffers, _ dist.ReduceOp) error {
			return pg.AllToAllSingle(ctx, b.out, b.in, nil, nil)
		},
		inCount:  func(count, n int) int { return count / n * n },
		outCount: func(count, n int) int { return count / n * n },
		// Element j of the block for rank d, sent by rank r.
		input: func(r, n, i, count int) float64 { return pattern(r+i/(count/n), i) },
		want: func(r, n, i, count int) float64 {
			per := count / n
			s := i / per // the sender
			return pattern(s+r, r*per+i%per)
		},
	},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce-perf:", err)
		dist.RecordError(err) // for the launcher's failure report
		os.Exit(1)
	}
}

func run() error {
	minBytes := flag.String("b", "8", "minimum size in bytes (K, M, G suffixes)")
	maxBytes := flag.String("e", "64M", "maximum size in bytes")
	factor := flag.Int("f", 2, "multiplication factor between sizes")
	sizeList := flag.String("sizes", "", "comma-separated sizes to run instead of -b, -e and -f, e.g. 8,64K,1M")
	opName := flag.String("o", "allreduce", "collective: allreduce, broadcast, allgather, reduce_scatter, alltoall")
	redName := flag.String("op", "sum", "reduction of allreduce and reduce_scatter: sum, prod, max, min, avg")
	dtypeName := flag.String("d", "float32", "data type: int8, uint8, int32, int64, float16, bfloat16, float32, float64")
	warmup := counts{5}
	flag.Var(&warmup, "w", "warmup iterations: one count, or one per size of -sizes (default 5)")
	iters := counts{20}
	flag.Var(&iters, "n", "timed iterations: one count, or one per size of -sizes (default 20)")
	check := flag.Int("c", 1, "check results (1) or not (0)")
	backend := flag.String("backend", "", "runtime backend: auto, nccl or tcp (default $GORUN_BACKEND, else auto)")
	huge := flag.Bool("hugepages", true, "put host buffers of 4 MiB and more on transparent huge pages, as numpy does (the anchors' buffers)")
	device := flag.String("device", "host", "where the buffers live: host, or cuda (this rank's GPU)")
	flag.Parse()
	if *device != "host" && *device != "cuda" {
		return fmt.Errorf("-device %q: want host or cuda", *device)
	}

	op, ok := collectives[*opName]
	if !ok {
		return fmt.Errorf("-o %q: unknown collective", *opName)
	}
	dt, ok := dtypes[*dtypeName]
	if !ok {
		return fmt.Errorf("-d %q: unknown data type", *dtypeName)
	}
	red, ok := reductions[*redName]
	if !ok {
		return fmt.Errorf("-op %q: unknown reduction (want sum, prod, max, min or avg)", *redName)
	}
	if red.op == dist.Avg && !dt.IsFloat() {
		return fmt.Errorf("-op avg needs a floating-point -d, not %s", *dtypeName)
	}
	redop := "none"
	if op.reduces {
		redop = *redName
	}
	plan, err := planSizes(*sizeList, *minBytes, *maxBytes, *factor)
	if err != nil {
		return err
	}
	sizes := plan.sizes
	for _, c := range []struct {
		flag string
		n    counts
	}{{"-w", warmup}, {"-n", iters}} {
		if len(c.n) != 1 && len(c.n) != len(sizes) {
			return fmt.Errorf("%s %s: want one count or one per size (%d sizes)", c.flag, c.n.String(), len(sizes))
		}
	}
	if slices.Contains(iters, 0) {
		return fmt.Errorf("-n %s: want at least one timed iteration per size", iters.String())
	}

	ctx := context.Background()
	var opts []dist.Option
	if *backend != "" {
		opts = append(opts, dist.WithBackend(*backend))
	}
	pg, err := dist.Init(ctx, opts...)
	if err != nil {
		return err
	}
	defer pg.Close()
	r, n := pg.Rank(), pg.Size()
	if r == 0 {
		fmt.Printf("# gorun %s: world %d, backend %s, %s buffers, minBytes %d maxBytes %d step: %s warmup iters: %s iters: %s validation: %d\n",
			*opName, n, pg.Backend(), *device, plan.min, plan.max, plan.step, warmup.String(), iters.String(), *check)
		fmt.Println("#")
		fmt.Printf("# %10s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
		fmt.Printf("# %10s  %12s  %8s  %6s  %6s  %8s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
	}

	var wrongTotal int
	var busSum float64
	var rows int
	for si, size := range sizes {
		count := max(size/dt.Size(), 1)
		if op.perRank {
			count = max(count-count%n, n)
		}
		b, err := newBuffers(pg, *device == "cuda", *huge, dt, op.inCount(count, n), op.outCount(count, n))
		if err != nil {
			return err
		}
		if err := fillInput(pg, op, red, &b, count); err != nil {
			b.free()
			return err
		}
		for i := 0; i < warmup.at(si); i++ {
			if err := op.run(ctx, pg, &b, red.op); err != nil {
				return err
			}
		}
		if err := pg.Barrier(ctx); err != nil {
			return err
		}
		start := time.Now()
		for i := 0; i < iters.at(si); i++ {
			if err := op.run(ctx, pg, &b, red.op); err != nil {
				return err
			}
		}
		elapsed := time.Since(start).Seconds() / float64(iters.at(si))
		// The slowest rank sets the pace, as nccl-tests reports it.
		slowest := []float64{elapsed}
		if err := pg.AllReduce(ctx, dist.Of(slowest), dist.Max); err != nil {
			return err
		}

		wrong := 0
		if *check != 0 {
			wrong, err = verify(ctx, pg, op, red, &b, count)
		}
		b.free()
		if err != nil {
			return err
		}
		bytes := float64(count * dt.Size())
		algbw := bytes / slowest[0] / 1e9
		busbw := algbw * op.busFactor(float64(n))
		wrongTotal += wrong
		busSum += busbw
		rows++
		if r == 0 {
			// As nccl-tests: size is the whole buffer, count what one rank
			// passes to the call (its share, for the per-rank collectives).
			shown := count
			if op.perRank {
				shown = count / n
			}
			fmt.Printf("  %10d  %12d  %8s  %6s  %6d  %8.1f  %6.2f  %6.2f  %6d\n",
				count*dt.Size(), shown, *dtypeName, redop, -1, slowest[0]*1e6, algbw, busbw, wrong)
		}
	}
	if r == 0 {
		fmt.Printf("# Out of bounds values : %d %s\n", wrongTotal, map[bool]string{true: "OK", false: "FAILED"}[wrongTotal == 0])
		fmt.Printf("# Avg bus bandwidth    : %.4g\n#\n", busSum/float64(rows))
	}
	if wrongTotal != 0 {
		return fmt.Errorf("%d wrong values", wrongTotal)
	}
	return nil
}

// verify runs op once on freshly initialised buffers and counts, over all
// ranks, the output elements that differ from the expected values. Device
// buffers are filled from, and read back into, host copies.
func verify(ctx context.Context, pg *dist.ProcessGroup, op collective, red reduction, b *buffers, count int) (int, error) {
	r, n := pg.Rank(), pg.Size()
	if err := fillInput(pg, op, red, b, count); err != nil {
		return 0, err
	}
	if err := op.run(ctx, pg, b, red.op); err != nil {
		return 0, err
	}
	out := b.out
	if out.Len() == 0 {
		out = b.in
	}
	result := newTensor(out.DType(), out.Len())
	if err := dist.Copy(result, out); err != nil {
		return 0, err
	}
	var wrong int64
	for i := 0; i < result.Len(); i++ {
		var want float64
		if op.reduces {
			want = roundTo(result, red.reduced(n, op.at(r, n, i, count)))
		} else {
			want = op.want(r, n, i, count)
		}
		if get(result, i) != want {
			wrong++
		}
	}
	total := []int64{wrong}
	err := pg.AllReduce(ctx, dist.Of(total), dist.Sum)
	return int(total[0]), err
}

var dtypes = map[string]dist.DType{
	"int8": dist.Int8, "uint8": dist.Uint8, "int32": dist.Int32, "int64": dist.Int64,
	"float16": dist.Float16, "bfloat16": dist.BFloat16, "float32": dist.Float32, "float64": dist.Float64,
	"float": dist.Float32, "double": dist.Float64, "half": dist.Float16,
}

// newTensor allocates n elements of dt on the Go heap.
func newTensor(dt dist.DType, n int) dist.Tensor {
	return tensorOver(dt, make([]byte, n*dt.Size()))
}

// roundTo is v as an element of t's dtype holds it: an average of
// integers is rounded once, as the collective's division rounds it.
func roundTo(t dist.Tensor, v float64) float64 {
	one := newTensor(t.DType(), 1)
	set(one, 0, v)
	return get(one, 0)
}

// tensorOver views mem as elements of dt.
func tensorOver(dt dist.DType, mem []byte) dist.Tensor {
	p, n := unsafe.Pointer(unsafe.SliceData(mem)), len(mem)/dt.Size()
	switch dt {
	case dist.Int8:
		return dist.Of(unsafe.Slice((*int8)(p), n))
	case dist.Uint8:
		return dist.Of(unsafe.Slice((*uint8)(p), n))
	case dist.Int32:
		return dist.Of(unsafe.Slice((*int32)(p), n))
	case dist.Int64:
		return dist.Of(unsafe.Slice((*int64)(p), n))
	case dist.Float16:
		return dist.Float16s(unsafe.Slice((*uint16)(p), n))
	case dist.BFloat16:
		return dist.BFloat16s(unsafe.Slice((*uint16)(p), n))
	case dist.Float64:
		return dist.Of(unsafe.Slice((*float64)(p), n))
	}
	return dist.Of(unsafe.Slice((*float32)(p), n))
}

func set(t dist.Tensor, i int, v float64) {
	switch t.DType() {
	case dist.Int8:
		dist.Elems[int8](t)[i] = int8(v)
	case dist.Uint8:
		dist.Elems[uint8](t)[i] = uint8(v)
	case dist.Int32:
		dist.Elems[int32](t)[i] = int32(v)
	case dist.Int64:
		dist.Elems[int64](t)[i] = int64(v)
	case dist.Float16:
		t.HalfBits()[i] = dist.ToFloat16(float32(v))
	case dist.BFloat16:
		t.HalfBits()[i] = dist.ToBFloat16(float32(v))
	case dist.Float32:
		dist.Elems[float32](t)[i] = float32(v)
	case dist.Float64:
		dist.Elems[float64](t)[i] = v
	}
}

func get(t dist.Tensor, i int) float64 {
	switch t.DType() {
	case dist.Int8:
		return float64(dist.Elems[int8](t)[i])
	case dist.Uint8:
		return float64(dist.Elems[uint8](t)[i])
	case dist.Int32:
		return float64(dist.Elems[int32](t)[i])
	case dist.Int64:
		return float64(dist.Elems[int64](t)[i])
	case dist.Float16:
		return float64(dist.FromFloat16(t.HalfBits()[i]))
	case dist.BFloat16:
		return float64(dist.FromBFloat16(t.HalfBits()[i]))
	case dist.Float32:
		return float64(dist.Elems[float32](t)[i])
	case dist.Float64:
		return dist.Elems[float64](t)[i]
	}
	return math.NaN()
}

// sizePlan is the sizes one run measures, and how the header line
// describes them.
type sizePlan struct {
	sizes    []int
	min, max int
	step     string
}

// planSizes returns the -sizes list when given, else the progression from
// -b to -e by -f.
func planSizes(list, minBytes, maxBytes string, factor int) (sizePlan, error) {
	if list != "" {
		plan := sizePlan{step: "list"}
		for _, field := range strings.Split(list, ",") {
			size, err := parseSize(strings.TrimSpace(field))
			if err != nil {
				return sizePlan{}, fmt.Errorf("-sizes: %w", err)
			}
			if size < 1 {
				return sizePlan{}, fmt.Errorf("-sizes: size %q: want at least 1 byte", field)
			}
			plan.sizes = append(plan.sizes, size)
		}
		plan.min, plan.max = slices.Min(plan.sizes), slices.Max(plan.sizes)
		return plan, nil
	}
	lo, err := parseSize(minBytes)
	if err != nil {
		return sizePlan{}, err
	}
	hi, err := parseSize(maxBytes)
	if err != nil {
		return sizePlan{}, err
	}
	if factor < 2 || lo < 1 || hi < lo {
		return sizePlan{}, fmt.Errorf("want 0 < -b <= -e and -f >= 2")
	}
	plan := sizePlan{min: lo, max: hi, step: strconv.Itoa(factor) + "(factor)"}
	for size := lo; size <= hi; size *= factor {
		plan.sizes = append(plan.sizes, size)
	}
	return plan, nil
}

// counts is an iteration-count flag: one count for every size, or a
// comma-separated count per size.
type counts []int

func (c *counts) String() string {
	if c == nil {
		return ""
	}
	fields := make([]string, len(*c))
	for i, n := range *c {
		fields[i] = strconv.Itoa(n)
	}
	return strings.Join(fields, ",")
}

func (c *counts) Set(s string) error {
	var parsed counts
	for _, field := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 0 {
			return fmt.Errorf("count %q: want a non-negative integer", field)
		}
		parsed = append(parsed, n)
	}
	*c = parsed
	return nil
}

// at is the count for the i-th size.
func (c counts) at(i int) int {
	if len(c) == 1 {
		return c[0]
	}
	return c[i]
}

// parseSize reads a byte count with an optional K, M or G suffix.
func parseSize(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("empty size")
	}
	mult := 1
	switch strings.ToUpper(s[len(s)-1:]) {
	case "K":
		mult = 1 << 10
	case "M":
		mult = 1 << 20
	case "G":
		mult = 1 << 30
	}
	if mult > 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want bytes with an optional K, M or G suffix", s)
	}
	return n * mult, nil
}

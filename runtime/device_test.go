package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/cuda"
	"github.com/gorun/gorun/cuda/cudatest"
	"github.com/gorun/gorun/rendezvous"
	"github.com/rs/zerolog"
)

// fakes compiles package cuda's fake libcuda and libnccl: device memory
// is host memory, and NCCL moves data for one rank.
var fakes *cudatest.Builder

func TestMain(m *testing.M) {
	b, err := cudatest.NewBuilder("../cuda/testdata")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakes = b
	code := m.Run()
	b.Close()
	os.Exit(code)
}

// fakeGPU is the environment of a rank whose GPU and NCCL are the fakes.
type fakeGPU struct {
	cuda, nccl string // the libraries' paths
}

// newFakeGPU builds fresh fakes, NCCL with defines.
func newFakeGPU(t *testing.T, defines ...string) fakeGPU {
	return fakeGPU{cuda: fakes.CUDA(t), nccl: fakes.NCCL(t, defines...)}
}

// env is what Init reads: the libraries, and more variables.
func (g fakeGPU) env(more ...string) map[string]string {
	env := map[string]string{"GORUN_CUDA_LIBRARY": g.cuda, "GORUN_NCCL_LIBRARY": g.nccl}
	for i := 0; i+1 < len(more); i += 2 {
		env[more[i]] = more[i+1]
	}
	return env
}

func (g fakeGPU) ncclLog(t *testing.T) string { return cudatest.NCCLLog(t, g.nccl) }

// expectReleased checks that the fake driver holds nothing: every
// buffer, stream, event and context was released.
func (g fakeGPU) expectReleased(t *testing.T) {
	t.Helper()
	for _, what := range []string{"device", "pinned", "streams", "events", "contexts"} {
		if n := cudatest.CUDALive(t, g.cuda, what); n != 0 {
			t.Errorf("%d %s still held after Close", n, what)
		}
	}
}

// openDevice opens GPU ordinal of the fake driver, as a program on the
// TCP backend does itself, closed when the test ends.
func (g fakeGPU) openDevice(t *testing.T, ordinal int) *cuda.Device {
	t.Helper()
	drv, err := cuda.LoadDriver(t.Context(), cuda.Search{LookupEnv: lookupIn(g.env())})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := drv.OpenDevice(ordinal)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Error(err)
		}
	})
	return dev
}

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) { v, ok := env[name]; return v, ok }
}

// initGPURanks runs Init on n goroutine ranks over TCP on the loopback
// interface, each reading envOf(rank), and body on each group; it returns
// each rank's Init error, failing the test on body's errors.
func initGPURanks(t *testing.T, n int, envOf func(rank int) map[string]string, body func(pg *ProcessGroup) error, opts ...Option) []error {
	t.Helper()
	store := rendezvous.NewMemoryStore(0)
	initErrs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			all := append([]Option{WithRank(r, n), WithStore(store), WithHost("127.0.0.1"), withEnv(envOf(r))}, opts...)
			pg, err := Init(ctx, all...)
			if err != nil {
				initErrs[r] = err
				return
			}
			defer func() {
				if err := pg.Close(); err != nil {
					t.Errorf("rank %d: close: %v", r, err)
				}
			}()
			if err := body(pg); err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		})
	}
	wg.Wait()
	return initErrs
}

// mustInit fails the test with any rank's Init error.
func mustInit(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: init: %v", r, err)
		}
	}
}

// logTo returns a logger writing JSON lines into a buffer at level and
// above, and the buffer's lines.
func logTo(level zerolog.Level) (zerolog.Logger, func() []string) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := zerolog.SyncWriter(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}))
	lines := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return strings.FieldsFunc(buf.String(), func(r rune) bool { return r == '\n' })
	}
	return zerolog.New(w).Level(level), lines
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// A place makes tensors on the host or on a GPU, from host tensors, and
// reads them back; its first failure sticks, to be checked once.
type place struct {
	dev *cuda.Device // nil: the host
	err error
	own []*cuda.DeviceBuffer
}

// copyOf returns a copy of host in the place.
func (p *place) copyOf(host Tensor) Tensor {
	if p.dev == nil {
		return Tensor{data: bytes.Clone(host.data), dtype: host.dtype}
	}
	if p.err != nil {
		return Tensor{}
	}
	t, err := NewDeviceTensor(p.dev, host.dtype, max(host.Len(), 1))
	if err != nil {
		p.err = err
		return Tensor{}
	}
	p.own = append(p.own, t.DeviceBuffer())
	t = t.Slice(0, host.Len())
	if err := Copy(t, host); err != nil {
		p.err = err
	}
	return t
}

// copiesOf returns copies of hosts in the place; joined ones are
// consecutive slices of one tensor.
func (p *place) copiesOf(hosts []Tensor, joined bool) []Tensor {
	if !joined {
		ts := make([]Tensor, len(hosts))
		for i, h := range hosts {
			ts[i] = p.copyOf(h)
		}
		return ts
	}
	var all []byte
	for _, h := range hosts {
		all = append(all, h.data...)
	}
	whole := p.copyOf(Tensor{data: all, dtype: hosts[0].dtype})
	ts := make([]Tensor, len(hosts))
	at := 0
	for i, h := range hosts {
		if p.err == nil {
			ts[i] = whole.Slice(at, at+h.Len())
		}
		at += h.Len()
	}
	return ts
}

// read returns t's content.
func (p *place) read(t Tensor) []byte {
	host := make([]byte, t.byteLen())
	if err := Copy(Tensor{data: host, dtype: t.dtype}, t); err != nil && p.err == nil {
		p.err = err
	}
	return host
}

func (p *place) free() error {
	var errs []error
	for _, b := range p.own {
		errs = append(errs, b.Free())
	}
	p.own = nil
	return errors.Join(errs...)
}

// A deviceCase is one operation, run on host tensors and on device
// copies of them: the results must be the same bytes. Outputs start as
// garbage, so an operation that does nothing fails.
type deviceCase struct {
	name string
	// run starts the operation on tensors of p, returning its Work and
	// the tensors holding its results on this rank.
	run func(pg *ProcessGroup, p *place) (*Work, []Tensor)
}

// garbage is a tensor of n elements of dt that no result holds.
func garbage(dt DType, n int) Tensor {
	return Tensor{data: bytes.Repeat([]byte{0xEE}, n*dt.Size()), dtype: dt}
}

// pieces returns size tensors of dt, piece i of length(i) elements with
// values from value(i, j).
func pieces[T Elem](size int, length func(i int) int, value func(i, j int) T) []Tensor {
	ts := make([]Tensor, size)
	for i := range ts {
		s := make([]T, length(i))
		for j := range s {
			s[j] = value(i, j)
		}
		ts[i] = Of(s)
	}
	return ts
}

func ramp[T Elem](n int, value func(j int) T) Tensor {
	return pieces(1, func(int) int { return n }, func(_, j int) T { return value(j) })[0]
}

// deviceCases covers every collective and message, each form of list.
func deviceCases() []deviceCase {
	var cases []deviceCase
	for _, op := range []struct {
		op ReduceOp
		t  func(rank int) Tensor
	}{
		{Sum, func(r int) Tensor { return ramp(5, func(j int) float32 { return float32(r*10 + j) }) }},
		{Max, func(r int) Tensor { return ramp(3, func(j int) int64 { return int64((r*7 + j) % 5) }) }},
		{Product, func(r int) Tensor { return ramp(3, func(j int) int32 { return int32(r + j + 1) }) }},
		{Avg, func(r int) Tensor { return ramp(4, func(j int) float64 { return float64(r*j) + 0.5 }) }},
		{Min, func(r int) Tensor { return ramp(2, func(j int) int8 { return int8(r - j) }) }},
		{Sum, func(r int) Tensor { return BFloat16s([]uint16{ToBFloat16(float32(r)), ToBFloat16(1.5)}) }},
		{Sum, func(r int) Tensor { return Float16s([]uint16{ToFloat16(float32(r)), ToFloat16(0.25)}) }},
	} {
		cases = append(cases, deviceCase{fmt.Sprintf("all_reduce %s %s", op.op, op.t(0).dtype), func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			t := p.copyOf(op.t(pg.Rank()))
			return pg.AllReduceAsync(t, op.op), []Tensor{t}
		}})
	}
	cases = append(cases,
		deviceCase{"broadcast", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			t := p.copyOf(ramp(6, func(j int) int32 { return int32(pg.Rank()*100 + j) }))
			return pg.BroadcastAsync(t, pg.Size()-1), []Tensor{t}
		}},
		deviceCase{"reduce", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			t := p.copyOf(ramp(4, func(j int) float64 { return float64(pg.Rank() + j) }))
			w := pg.ReduceAsync(t, 0, Sum)
			if pg.Rank() != 0 {
				return w, nil // left unspecified
			}
			return w, []Tensor{t}
		}},
		deviceCase{"all_gather_into_tensor", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			in := p.copyOf(ramp(3, func(j int) uint8 { return uint8(pg.Rank()*3 + j) }))
			out := p.copyOf(garbage(Uint8, 3*pg.Size()))
			return pg.AllGatherIntoAsync(out, in), []Tensor{out}
		}},
		deviceCase{"reduce_scatter_tensor", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			in := p.copyOf(ramp(2*pg.Size(), func(j int) float32 { return float32(pg.Rank() + j) }))
			out := p.copyOf(garbage(Float32, 2))
			return pg.ReduceScatterFromAsync(out, in, Sum), []Tensor{out}
		}},
		deviceCase{"all_to_all_single uneven", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			rank, size := pg.Rank(), pg.Size()
			inSplits, outSplits := make([]int, size), make([]int, size)
			for peer := range size {
				inSplits[peer], outSplits[peer] = peer+1, rank+1
			}
			in := p.copyOf(ramp(size*(size+1)/2, func(j int) int64 { return int64(100*rank + j) }))
			out := p.copyOf(garbage(Int64, size*(rank+1)))
			return pg.AllToAllSingleAsync(out, in, outSplits, inSplits), []Tensor{out}
		}},
	)
	for _, joined := range []bool{false, true} {
		how := map[bool]string{false: "separate", true: "joined"}[joined]
		cases = append(cases,
			deviceCase{"all_gather " + how, func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
				in := p.copyOf(ramp(2, func(j int) int32 { return int32(pg.Rank()*10 + j) }))
				out := p.copiesOf(pieces(pg.Size(), func(int) int { return 2 }, func(int, int) int32 { return -1 }), joined)
				return pg.AllGatherAsync(out, in), out
			}},
			deviceCase{"gather " + how, func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
				root := pg.Size() - 1
				in := p.copyOf(ramp(2, func(j int) float32 { return float32(pg.Rank()) + float32(j)/4 }))
				var out []Tensor
				if pg.Rank() == root {
					out = p.copiesOf(pieces(pg.Size(), func(int) int { return 2 }, func(int, int) float32 { return -1 }), joined)
				}
				return pg.GatherAsync(out, in, root), out
			}},
			deviceCase{"scatter " + how, func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
				var in []Tensor
				if pg.Rank() == 0 {
					in = p.copiesOf(pieces(pg.Size(), func(int) int { return 3 }, func(i, j int) int64 { return int64(i*i + j) }), joined)
				}
				out := p.copyOf(garbage(Int64, 3))
				return pg.ScatterAsync(out, in, 0), []Tensor{out}
			}},
			deviceCase{"reduce_scatter uneven " + how, func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
				in := p.copiesOf(pieces(pg.Size(), func(i int) int { return i + 1 }, func(i, j int) float64 { return float64(pg.Rank()*i + j) }), joined)
				out := p.copyOf(garbage(Float64, pg.Rank()+1))
				return pg.ReduceScatterAsync(out, in, Max), []Tensor{out}
			}},
			deviceCase{"all_to_all uneven " + how, func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
				rank := pg.Rank()
				in := p.copiesOf(pieces(pg.Size(), func(int) int { return rank + 1 }, func(peer, j int) int32 { return int32(100*rank + peer + j) }), joined)
				out := p.copiesOf(pieces(pg.Size(), func(peer int) int { return peer + 1 }, func(int, int) int32 { return -1 }), joined)
				return pg.AllToAllAsync(out, in), out
			}},
		)
	}
	return cases
}

// messageCases are point-to-point messages: a ring both ways, one batch
// and single messages. They need two ranks or more.
func messageCases() []deviceCase {
	return []deviceCase{
		{"batch_isend_irecv ring", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			rank, size := pg.Rank(), pg.Size()
			next, prev := (rank+1)%size, (rank+size-1)%size
			fromPrev, fromNext := p.copyOf(garbage(Float32, 3)), p.copyOf(garbage(Float32, 4))
			works := pg.BatchISendIRecv([]P2POp{
				{Op: SendOp, Tensor: p.copyOf(ramp(3, func(j int) float32 { return float32(rank*10 + j) })), Peer: next, Tag: 1},
				{Op: SendOp, Tensor: p.copyOf(ramp(4, func(j int) float32 { return float32(-rank*10 - j) })), Peer: prev, Tag: 2},
				{Op: RecvOp, Tensor: fromPrev, Peer: prev, Tag: 1},
				{Op: RecvOp, Tensor: fromNext, Peer: next, Tag: 2},
			})
			return joinWorks(works), []Tensor{fromPrev, fromNext}
		}},
		{"send and recv", func(pg *ProcessGroup, p *place) (*Work, []Tensor) {
			// Even ranks send first, odd ones receive first: NCCL's lone
			// sends wait for their receives.
			rank, size := pg.Rank(), pg.Size()
			if size%2 == 1 && rank == size-1 {
				return nil, nil // no partner
			}
			peer := rank ^ 1
			mine := p.copyOf(ramp(5, func(j int) int32 { return int32(rank*1000 + j) }))
			theirs := p.copyOf(garbage(Int32, 5))
			var first, second *Work
			if rank%2 == 0 {
				first, second = pg.ISend(mine, peer, 7), pg.IRecv(theirs, peer, 7)
			} else {
				first, second = pg.IRecv(theirs, peer, 7), pg.ISend(mine, peer, 7)
			}
			return joinWorks([]*Work{first, second}), []Tensor{theirs}
		}},
	}
}

// joinWorks returns a Work that finishes when works have, with their
// errors.
func joinWorks(works []*Work) *Work {
	w := newWork(context.Background(), "works", nil)
	go func() {
		var errs []error
		for _, each := range works {
			errs = append(errs, each.Wait(context.Background()))
		}
		w.finish(errors.Join(errs...))
	}()
	return w
}

// compareWithHost runs every case on the host and on dev, and returns an
// error naming each case whose results differ. Every rank runs the same
// cases in the same order.
func compareWithHost(ctx context.Context, pg *ProcessGroup, dev *cuda.Device, cases []deviceCase) error {
	var errs []error
	for _, c := range cases {
		host, device := &place{}, &place{dev: dev}
		hw, hout := c.run(pg, host)
		dw, dout := c.run(pg, device)
		if hw == nil {
			continue
		}
		err := errors.Join(hw.Wait(ctx), dw.Wait(ctx), device.err)
		if err == nil {
			for i := range hout {
				if want, got := hout[i].data, device.read(dout[i]); !bytes.Equal(got, want) {
					err = fmt.Errorf("output %d is % x on the GPU, % x on the host", i, got, want)
					break
				}
			}
		}
		if err = errors.Join(err, device.err, device.free()); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
		}
	}
	// A sent message may still be on its way when its Send returns: no
	// rank closes before every rank has received.
	return errors.Join(append(errs, pg.Barrier(ctx))...)
}

package runtime

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/gorun/gorun/collective"
)

// fakeNet joins the ranks of in-process fake communicators. A collective
// is an exchange: every rank deposits its call and its input, and once all
// have, each computes its own result from all inputs. Messages go through
// per-rank mailboxes. It is just enough of a collective.Comm to test the
// runtime without sockets.
type fakeNet struct {
	size int

	mu      sync.Mutex
	rounds  map[int]*round
	mail    map[int][]message // by destination
	arrival chan struct{}     // closed and replaced when mail arrives
	subnets map[string]*fakeNet
}

type round struct {
	calls  []string // each rank's description of its call
	inputs []any
	left   int           // ranks yet to arrive
	read   int           // ranks that took the result
	full   chan struct{} // closed when every rank arrived
}

type message struct {
	src, tag int
	data     []byte
}

func newFakeNet(size int) *fakeNet {
	return &fakeNet{
		size:    size,
		rounds:  make(map[int]*round),
		mail:    make(map[int][]message),
		arrival: make(chan struct{}),
		subnets: make(map[string]*fakeNet),
	}
}

// comm returns rank's communicator.
func (n *fakeNet) comm(rank int) *fakeComm {
	return &fakeComm{net: n, rank: rank, closed: make(chan struct{})}
}

// subnet returns the network of the split named id, shared by its ranks.
func (n *fakeNet) subnet(id string, size int) *fakeNet {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.subnets[id] == nil {
		n.subnets[id] = newFakeNet(size)
	}
	return n.subnets[id]
}

type fakeComm struct {
	net       *fakeNet
	rank      int
	seq       int // collectives so far: the Comm contract runs them one at a time
	closed    chan struct{}
	closeOnce sync.Once
}

var _ collective.Comm = (*fakeComm)(nil)

func (c *fakeComm) Rank() int { return c.rank }
func (c *fakeComm) Size() int { return c.net.size }

func (c *fakeComm) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return nil
}

// exchange deposits this rank's call and input and returns every rank's
// input once all have arrived with the same call.
func (c *fakeComm) exchange(ctx context.Context, call string, input any) ([]any, error) {
	n := c.net
	c.seq++
	n.mu.Lock()
	r := n.rounds[c.seq]
	if r == nil {
		r = &round{calls: make([]string, n.size), inputs: make([]any, n.size), left: n.size, full: make(chan struct{})}
		n.rounds[c.seq] = r
	}
	r.calls[c.rank], r.inputs[c.rank] = call, input
	if r.left--; r.left == 0 {
		close(r.full)
	}
	n.mu.Unlock()

	select {
	case <-r.full:
	case <-c.closed:
		return nil, collective.ErrClosed
	case <-ctx.Done():
		n.mu.Lock()
		var missing []int
		for rank, call := range r.calls {
			if call == "" {
				missing = append(missing, rank)
			}
		}
		n.mu.Unlock()
		return nil, fmt.Errorf("fake: %s: waiting for ranks %v: %w", call, missing, context.Cause(ctx))
	}
	n.mu.Lock()
	if r.read++; r.read == n.size {
		delete(n.rounds, c.seq)
	}
	n.mu.Unlock()
	for rank, other := range r.calls {
		if other != call {
			return nil, fmt.Errorf("fake: this rank called %s, rank %d called %s: %w", call, rank, other, collective.ErrMismatch)
		}
	}
	return r.inputs, nil
}

// exchangeBytes is exchange of a copy of buf.
func (c *fakeComm) exchangeBytes(ctx context.Context, call string, buf []byte) ([][]byte, error) {
	inputs, err := c.exchange(ctx, call, slices.Clone(buf))
	if err != nil {
		return nil, err
	}
	bufs := make([][]byte, len(inputs))
	for i, in := range inputs {
		bufs[i] = in.([]byte)
	}
	return bufs, nil
}

// reduceAll combines bufs, in rank order, into dst.
func reduceAll(dst []byte, bufs [][]byte, dt collective.DType, op collective.Op) error {
	copy(dst, bufs[0])
	for _, b := range bufs[1:] {
		if err := collective.ReduceInto(dst, b, dt, op); err != nil {
			return err
		}
	}
	if op == collective.Avg {
		return divide(dst, dt, len(bufs))
	}
	return nil
}

func divide(buf []byte, dt collective.DType, n int) error {
	switch dt {
	case collective.Float32:
		for i, v := range Elems[float32](Tensor{data: buf, dtype: dt}) {
			Elems[float32](Tensor{data: buf, dtype: dt})[i] = v / float32(n)
		}
	case collective.Float64:
		for i, v := range Elems[float64](Tensor{data: buf, dtype: dt}) {
			Elems[float64](Tensor{data: buf, dtype: dt})[i] = v / float64(n)
		}
	default:
		return fmt.Errorf("fake: avg of %s", dt)
	}
	return nil
}

func (c *fakeComm) AllReduce(ctx context.Context, buf []byte, dt collective.DType, op collective.Op) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("all_reduce(%s x %d, %s)", dt, len(buf), op), buf)
	if err != nil {
		return err
	}
	return reduceAll(buf, bufs, dt, op)
}

func (c *fakeComm) Broadcast(ctx context.Context, buf []byte, dt collective.DType, root int) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("broadcast(%s x %d, root %d)", dt, len(buf), root), buf)
	if err != nil {
		return err
	}
	copy(buf, bufs[root])
	return nil
}

func (c *fakeComm) Reduce(ctx context.Context, buf []byte, dt collective.DType, op collective.Op, root int) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("reduce(%s x %d, %s, root %d)", dt, len(buf), op, root), buf)
	if err != nil || c.rank != root {
		return err
	}
	return reduceAll(buf, bufs, dt, op)
}

func (c *fakeComm) AllGather(ctx context.Context, out, in []byte, dt collective.DType) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("all_gather(%s x %d)", dt, len(in)), in)
	if err != nil {
		return err
	}
	copy(out, slices.Concat(bufs...))
	return nil
}

func (c *fakeComm) Gather(ctx context.Context, out, in []byte, dt collective.DType, root int) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("gather(%s x %d, root %d)", dt, len(in), root), in)
	if err == nil && c.rank == root {
		copy(out, slices.Concat(bufs...))
	}
	return err
}

func (c *fakeComm) Scatter(ctx context.Context, out, in []byte, dt collective.DType, root int) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("scatter(%s x %d, root %d)", dt, len(out), root), in)
	if err == nil {
		copy(out, bufs[root][c.rank*len(out):])
	}
	return err
}

func (c *fakeComm) ReduceScatter(ctx context.Context, out, in []byte, dt collective.DType, op collective.Op, counts []int) error {
	bufs, err := c.exchangeBytes(ctx, fmt.Sprintf("reduce_scatter(%s x %v, %s)", dt, counts, op), in)
	if err != nil {
		return err
	}
	sum := make([]byte, len(in))
	if err := reduceAll(sum, bufs, dt, op); err != nil {
		return err
	}
	offset := 0
	for _, n := range counts[:c.rank] {
		offset += n * dt.Size()
	}
	copy(out, sum[offset:])
	return nil
}

func (c *fakeComm) AllToAll(ctx context.Context, out, in []byte, dt collective.DType, sendCounts, recvCounts []int) error {
	type piece struct {
		data   []byte
		counts []int
	}
	inputs, err := c.exchange(ctx, fmt.Sprintf("all_to_all(%s)", dt), piece{slices.Clone(in), slices.Clone(sendCounts)})
	if err != nil {
		return err
	}
	for src, input := range inputs {
		p := input.(piece)
		offset := 0
		for _, n := range p.counts[:c.rank] {
			offset += n * dt.Size()
		}
		size := p.counts[c.rank] * dt.Size()
		if size != recvCounts[src]*dt.Size() {
			return fmt.Errorf("fake: rank %d sends %d elements, rank %d expects %d: %w", src, p.counts[c.rank], c.rank, recvCounts[src], collective.ErrMismatch)
		}
		out = out[copy(out, p.data[offset:offset+size]):]
	}
	return nil
}

func (c *fakeComm) Barrier(ctx context.Context) error {
	_, err := c.exchange(ctx, "barrier", nil)
	return err
}

func (c *fakeComm) Split(ctx context.Context, ranks []int, id string) (collective.Comm, error) {
	if _, err := c.exchange(ctx, fmt.Sprintf("split(%v, %q)", ranks, id), nil); err != nil {
		return nil, err
	}
	i := slices.Index(ranks, c.rank)
	if i < 0 {
		return nil, nil
	}
	return c.net.subnet(id, len(ranks)).comm(i), nil
}

func (c *fakeComm) Send(ctx context.Context, buf []byte, dt collective.DType, peer, tag int) error {
	n := c.net
	n.mu.Lock()
	defer n.mu.Unlock()
	n.mail[peer] = append(n.mail[peer], message{src: c.rank, tag: tag, data: slices.Clone(buf)})
	close(n.arrival)
	n.arrival = make(chan struct{})
	return nil
}

func (c *fakeComm) Recv(ctx context.Context, buf []byte, dt collective.DType, peer, tag int) (int, error) {
	n := c.net
	for {
		n.mu.Lock()
		box := n.mail[c.rank]
		i := slices.IndexFunc(box, func(m message) bool {
			return m.tag == tag && (peer == collective.AnySource || m.src == peer)
		})
		if i >= 0 {
			m := box[i]
			n.mail[c.rank] = slices.Delete(box, i, i+1)
			n.mu.Unlock()
			if len(m.data) != len(buf) {
				return m.src, fmt.Errorf("fake: %d bytes from rank %d for a %d-byte buffer: %w", len(m.data), m.src, len(buf), collective.ErrMismatch)
			}
			copy(buf, m.data)
			return m.src, nil
		}
		arrival := n.arrival
		n.mu.Unlock()
		select {
		case <-arrival:
		case <-c.closed:
			return -1, collective.ErrClosed
		case <-ctx.Done():
			return -1, fmt.Errorf("fake: recv from %d, tag %d: %w", peer, tag, context.Cause(ctx))
		}
	}
}

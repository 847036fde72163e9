package collective

import (
	"context"
	"fmt"
)

// AllToAll sends slice i of in to rank i and gathers rank i's slice for
// us into slice i of out: through shared memory when the world has it
// (movement_shm.go), else by pairwise exchange: at distance s = 1..n-1
// rank r sends to r+s and receives from r-s. All receives are posted into
// place before the first send, and each peer's connection has its own
// writer, so the exchanges overlap.
func (c *comm) AllToAll(ctx context.Context, out, in []byte, dt DType, sendCounts, recvCounts []int) error {
	if dt.Size() == 0 {
		return fmt.Errorf("collective: all_to_all: unknown dtype %v", dt)
	}
	n, me, es := c.size(), c.rank, dt.Size()
	if len(sendCounts) != n || len(recvCounts) != n {
		return fmt.Errorf("collective: all_to_all: %d send and %d receive counts for %d ranks", len(sendCounts), len(recvCounts), n)
	}
	sends, recvs := fillCountSpans(c.spanScratch(0, n), sendCounts, es), fillCountSpans(c.spanScratch(1, n), recvCounts, es)
	if last := sends[n-1]; last.off+last.len != len(in) || slicesNegative(sendCounts) {
		return fmt.Errorf("collective: all_to_all: in holds %d bytes, the send counts say %d", len(in), last.off+last.len)
	}
	if last := recvs[n-1]; last.off+last.len != len(out) || slicesNegative(recvCounts) {
		return fmt.Errorf("collective: all_to_all: out holds %d bytes, the receive counts say %d", len(out), last.off+last.len)
	}
	if sendCounts[me] != recvCounts[me] {
		return fmt.Errorf("collective: all_to_all: rank %d sends itself %d elements but expects %d", me, sendCounts[me], recvCounts[me])
	}
	algo := c.allToAllAlgorithm()
	o, err := c.begin(ctx, header{coll: collAllToAll, dtype: dt, algo: algo})
	if err != nil {
		return err
	}
	switch algo {
	case algoShm:
		return c.end(o, o.allToAllShared(out, in, sends, recvs))
	case algoHier:
		return c.end(o, o.allToAllHierarchical(out, in, sends, recvs))
	}
	first := len(o.recvs) // the receives below follow each other there
	for s := 1; s < n; s++ {
		from := (me - s + n) % n
		o.hdr.count = uint64(recvCounts[from]) // frames carry the pair's count
		o.expect(from, recvs[from].of(out), 0)
	}
	for s := 1; s < n; s++ {
		to := (me + s) % n
		o.hdr.count = uint64(sendCounts[to])
		if err := o.send(to, sends[to].of(in), 0); err != nil {
			return c.end(o, err)
		}
	}
	copy(recvs[me].of(out), sends[me].of(in))
	return c.end(o, o.awaitAll(o.recvs[first:]))
}

func slicesNegative(counts []int) bool {
	for _, n := range counts {
		if n < 0 {
			return true
		}
	}
	return false
}

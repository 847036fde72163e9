package collective

import (
	"context"
	"fmt"
	"math/bits"
)

// Broadcast copies root's buf to every rank: through shared memory when
// the world has it (movement_shm.go), else down a binomial tree for
// small buffers (log2(n) hops), down a chain for large ones, where every
// rank forwards each segment as it lands so that all links carry data at
// once.
func (c *comm) Broadcast(ctx context.Context, buf []byte, dt DType, root int) error {
	if err := checkBuffer("broadcast", buf, dt); err != nil {
		return err
	}
	if err := c.checkRoot("broadcast", root); err != nil {
		return err
	}
	algo := c.broadcastAlgorithm(len(buf))
	o, err := c.begin(ctx, header{coll: collBroadcast, dtype: dt, algo: algo, root: int32(root), count: uint64(len(buf) / dt.Size())})
	if err != nil {
		return err
	}
	switch algo {
	case algoShm:
		return c.end(o, o.broadcastShared(buf, root))
	case algoHier:
		return c.end(o, o.broadcastHierarchical(buf, root))
	}
	var kids [bits.UintSize]int
	parent, children := broadcastRoute(algo, c.rank, root, c.size(), kids[:0])
	return c.end(o, o.broadcast(buf, parent, children))
}

// broadcastRoute gives rank's parent and children in a broadcast from
// root among n ranks: down a pipelined chain for algoChain, else down a
// binomial tree. The children are appended to children.
func broadcastRoute(algo algorithm, rank, root, n int, children []int) (parent int, _ []int) {
	if algo == algoChain {
		return chain(rank, root, n, children)
	}
	return binomialTree(rank, root, n, children)
}

func (c *comm) checkRoot(what string, root int) error {
	if root < 0 || root >= c.size() {
		return fmt.Errorf("collective: %s: root %d out of range for %d ranks", what, root, c.size())
	}
	return nil
}

// broadcast receives buf from parent (none at the root, -1) and forwards
// every segment to the children as it lands.
func (o *op) broadcast(buf []byte, parent int, children []int) error {
	if parent < 0 {
		for _, child := range children {
			if err := o.send(child, buf, 0); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range o.expect(parent, buf, 0) {
		if err := o.await(r); err != nil {
			return err
		}
		for _, child := range children {
			if err := o.send(child, r.buf, int(r.want.offset)); err != nil {
				return err
			}
		}
	}
	return nil
}

// binomialTree gives rank's parent (-1 at the root) and children, largest
// subtree first, in the binomial tree of n ranks rooted at root: relative
// rank v receives from v minus its lowest set bit and sends to v+1, v+2,
// v+4, ... below that bit. The children are appended to children, which
// has room for bits.UintSize.
func binomialTree(rank, root, n int, children []int) (parent int, _ []int) {
	rel := (rank - root + n) % n
	abs := func(v int) int { return (v + root) % n }
	parent = -1
	mask := 1
	for ; mask < n; mask <<= 1 {
		if rel&mask != 0 {
			parent = abs(rel - mask)
			break
		}
	}
	for mask >>= 1; mask > 0; mask >>= 1 {
		if rel+mask < n {
			children = append(children, abs(rel+mask))
		}
	}
	return parent, children
}

// chain gives rank's neighbours in the chain root, root+1, ..., root-1,
// appending its child to children.
func chain(rank, root, n int, children []int) (parent int, _ []int) {
	rel := (rank - root + n) % n
	parent = -1
	if rel > 0 {
		parent = (rank + n - 1) % n
	}
	if rel < n-1 {
		children = append(children, (rank+1)%n)
	}
	return parent, children
}

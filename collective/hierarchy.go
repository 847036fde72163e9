package collective

import (
	"errors"
	"slices"
	"strconv"
)

// Hierarchical collectives, for a world that spans hosts where some host
// runs more than one rank: the default there (algorithm.go), since each
// host's link then carries the host's data once instead of once per
// rank. A collective runs in phases: the ranks of each host combine
// their data in shared memory, the collective runs across hosts over
// TCP, and the result is handed out to each host's ranks in shared
// memory. The all_reduce, all_gather, reduce_scatter and all_to_all
// cross on every rail at once, each local rank with its share of the
// buffer (hierarchy_allreduce.go, hierarchy_movement.go); broadcast,
// barrier and small buffers cross between the hosts' leaders, their
// lowest ranks (hierarchy_leaders.go).
//
// The phases run on views of the world: communicators of a subset of its
// ranks that share its id, its call (the op's header, so every frame and
// every call published in shared memory is the world's), and its
// failure. A view's frames land in the world's mailboxes, so a rank that
// made another call (a flat broadcast, say) meets a frame it does not
// expect and both fail with a mismatch, as in a flat algorithm; every
// world call is published in the host's shared memory (comm.begin), so a
// host peer in another call is caught there. A phase that fails names
// ranks in the view's terms: the error is translated to world ranks
// (inParentTerms) before the world op fails with it and tells every rank.
//
// Every element's result is computed from the hosts' sums (each in rank
// order), in an order shared by every rank that computes it, then copied
// to every rank: all ranks get the same bits. They are not the bits of a flat
// all_reduce, which adds in rank order ((x0+x1)+x2)+x3 where this adds
// (x0+x1)+(x2+x3); for the integer types and for exact floating-point
// sums the results agree.

// hierarchy is the world's views for hierarchical collectives, and
// where every rank sits: host h runs ranks hostRanks[h] (ascending),
// hosts numbered by their lowest rank; a rank's local index is its
// position among its host's ranks.
type hierarchy struct {
	host    *comm // this host's ranks; its rank 0 is the host's leader
	leaders *comm // the leaders, one per host by ascending rank; nil on other ranks
	// rail is the ranks of this rank's local index, one per host that
	// has that many ranks, in host order: the leaders are rail 0. The 2D
	// all_reduce runs its inter-host phase on the rails, so that every
	// local rank's streams carry its share of the host's traffic.
	rail *comm
	// leaderOf[r] is the leaders' rank of world rank r's host's leader,
	// which is also the index of r's host.
	leaderOf []int
	// localOf[r] is world rank r's local index.
	localOf []int
	// hostRanks[h] is host h's world ranks, ascending.
	hostRanks [][]int

	// twoD says the all_reduce runs in two dimensions (a host's ranks
	// share memory: hierarchy_allreduce.go), else through the leaders.
	twoD   bool
	reduce railReduce // the all_reduce in flight, its scratch reused
}

// hostOf is the index of world rank r's host.
func (h *hierarchy) hostOf(r int) int { return h.leaderOf[r] }

// minLocal is the fewest ranks any host runs: the rails every host has.
func (h *hierarchy) minLocal() int {
	m := len(h.hostRanks[0])
	for _, rs := range h.hostRanks[1:] {
		m = min(m, len(rs))
	}
	return m
}

// railRanks is the world ranks of local index l, one per host that has
// that many ranks, in host order.
func (h *hierarchy) railRanks(l int) []int {
	var rail []int
	for _, rs := range h.hostRanks {
		if l < len(rs) {
			rail = append(rail, rs[l])
		}
	}
	return rail
}

// newHierarchy builds the views of world, whose ranks run on hosts (an
// empty id is a host of its own), or returns nil when no host runs two
// ranks or all run on one: hierarchy would not save anything. shm is
// this host's shared memory, or nil; shared says the world's hosts
// share memory among their ranks (every rank is told the same).
func newHierarchy(world *comm, hosts []string, shm *shmWorld, shared bool) *hierarchy {
	h := layOut(hosts)
	if h == nil {
		return nil
	}
	h.twoD = shared
	me := world.rank
	h.host = newView(world, h.hostRanks[h.hostOf(me)])
	h.host.shm = shm
	h.rail = newView(world, h.railRanks(h.localOf[me]))
	if h.localOf[me] == 0 {
		h.leaders = h.rail
	}
	return h
}

// layOut places the ranks of a world on hosts, rank r on hosts[r], or
// returns nil when hierarchy would not save anything (see newHierarchy).
func layOut(hosts []string) *hierarchy {
	h := &hierarchy{leaderOf: make([]int, len(hosts)), localOf: make([]int, len(hosts))}
	index := map[string]int{} // host id -> host index
	crowded := false
	for r, id := range hosts {
		if id == "" {
			id = "rank " + strconv.Itoa(r) // a host of its own: no id starts so
		}
		hi, seen := index[id]
		if !seen {
			hi = len(h.hostRanks)
			index[id] = hi
			h.hostRanks = append(h.hostRanks, nil)
		}
		crowded = crowded || seen
		h.leaderOf[r] = hi
		h.localOf[r] = len(h.hostRanks[hi])
		h.hostRanks[hi] = append(h.hostRanks[hi], r)
	}
	if !crowded || len(h.hostRanks) < 2 {
		return nil
	}
	return h
}

// newView is the view of parent made of members (parent ranks, in the
// view's order, parent's own rank among them).
func newView(parent *comm, members []int) *comm {
	world := make([]int, len(members))
	for i, m := range members {
		world[i] = parent.world[m]
	}
	v := newComm(parent.t, parent.id, slices.Index(members, parent.rank), world)
	v.parent = parent
	v.failed = parent.failed
	v.cfg.algo = algoAuto
	return v
}

// join starts the view's part of the parent's op o.
func (v *comm) join(o *op) *op {
	vo := &v.coll
	vo.reset(v, o.ctx, o.hdr)
	return vo
}

// leave ends the view's part vo, which err ended: it withdraws what is
// outstanding on failure, and returns err in the parent's terms. Unlike
// op.finish it neither fails the world nor tells anyone: the world op
// does, with the error this returns.
func (v *comm) leave(vo *op, err error) error {
	return v.settle(vo, v.viewErr(err))
}

// settle is leave for an error in the parent's terms already.
func (v *comm) settle(vo *op, err error) error {
	if err == nil {
		err = v.viewErr(vo.flush())
	}
	if err != nil {
		vo.withdraw()
	}
	vo.release()
	return err
}

// viewErr is err, which an op of view v returned, in the parent's terms:
// the world's failure once it has one.
func (v *comm) viewErr(err error) error {
	if err == nil {
		return nil
	}
	select {
	case <-v.failed:
		return v.failure() // the world's, in its terms already
	default:
	}
	return v.inParentTerms(err)
}

// inParentTerms rewrites the ranks an error of view c names as the
// parent's ranks.
func (c *comm) inParentTerms(err error) error {
	rank := func(r int) int {
		if r >= 0 && r < len(c.world) {
			return c.parent.commRank(c.world[r], r)
		}
		return r
	}
	var pe *PeerError
	var me *MismatchError
	switch {
	case errors.As(err, &me):
		e := *me
		e.Viewer, e.RankA, e.RankB = rank(e.Viewer), rank(e.RankA), rank(e.RankB)
		return &e
	case errors.As(err, &pe):
		e := *pe
		e.Rank = rank(e.Rank)
		var wt *waitTimeout
		if errors.As(e.Err, &wt) {
			w := *wt
			w.ranks = make([]int, len(wt.ranks))
			for i, r := range wt.ranks {
				w.ranks[i] = rank(r)
			}
			e.Err = &w
		}
		return &e
	}
	return err
}

// barrierHierarchical returns once every rank has entered: each host
// meets, then the leaders, then each host again, its leader arriving
// last.
func (o *op) barrierHierarchical() error {
	h := o.c.hier
	if err := h.host.hostBarrier(o); err != nil {
		return err
	}
	if h.leaders != nil {
		lo := h.leaders.join(o)
		if err := h.leaders.leave(lo, lo.dissemination()); err != nil {
			return err
		}
	}
	return h.host.hostBarrier(o)
}

// reduceToLeader reduces buf across host view v into its leader's buf.
func (v *comm) reduceToLeader(o *op, buf []byte) error {
	if v.size() == 1 {
		return nil
	}
	vo := v.join(o)
	var err error
	if v.shared() {
		err = vo.reduceShared(buf, 0)
	} else {
		err = vo.reduceTree(buf, 0)
	}
	return v.leave(vo, err)
}

// broadcastFromLeader copies the leader's buf to host view v.
func (v *comm) broadcastFromLeader(o *op, buf []byte) error {
	if v.size() == 1 {
		return nil
	}
	vo := v.join(o)
	return v.leave(vo, vo.broadcastInView(buf, 0))
}

// hostBarrier meets the ranks of host view v.
func (v *comm) hostBarrier(o *op) error {
	if v.size() == 1 {
		return nil
	}
	vo := v.join(o)
	if v.shared() {
		return v.leave(vo, vo.allReduceSharedFlat(nil))
	}
	return v.leave(vo, vo.dissemination())
}

// broadcastInView copies root's buf to the view's ranks: in shared memory
// when the view has it, else down a binomial tree.
func (o *op) broadcastInView(buf []byte, root int) error {
	if o.c.size() == 1 {
		return nil
	}
	if o.c.shared() {
		return o.broadcastShared(buf, root)
	}
	var kids [64]int
	parent, children := binomialTree(o.c.rank, root, o.c.size(), kids[:0])
	return o.broadcast(buf, parent, children)
}

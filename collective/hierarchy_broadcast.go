package collective

// broadcastHierarchical copies root's buf to its host in shared memory,
// from the host's leader to the other leaders, and from each leader to
// its host in shared memory: in pieces (piecesOf), so that the link
// carries one piece while the hosts copy another. A leader posts the
// receives of every piece first, and forwards each segment as it lands.
// The leaders pass it down a binomial tree (log2 H hops) up to
// broadcastTreeMax, down a chain above, as the flat broadcast chooses: down
// the tree the root's leader sends the whole buffer to log2 H children
// over its one link, which halved the bound on 4 hosts (48% of it at 1
// and 16 MiB, shaped to 500 Mbit/s), where down the chain every link
// carries it once.
func (o *op) broadcastHierarchical(buf []byte, root int) error {
	h, me := o.c.hier, o.c.rank
	x := hierBroadcast{
		buf:      buf,
		es:       o.hdr.dtype.Size(),
		pieces:   piecesOf(len(buf)),
		hv:       h.host,
		lv:       h.leaders,
		rootHost: h.hostOf(root),
	}
	x.onRootHost = h.hostOf(me) == x.rootHost
	if x.onRootHost {
		x.hostRoot = h.localOf[root]
	}
	x.ho = x.hv.join(o)
	if x.lv != nil {
		x.lo = x.lv.join(o)
	}
	err := x.run()
	if x.lo != nil {
		err = x.lv.settle(x.lo, err)
	}
	return x.hv.settle(x.ho, err)
}

// hierBroadcast is one hierarchical broadcast in flight on this rank.
type hierBroadcast struct {
	buf        []byte
	es, pieces int
	hv, lv     *comm // the host's view, the leaders' (nil off them)
	ho, lo     *op
	rootHost   int  // the root's host, which is its leader's rank among the leaders
	onRootHost bool // this rank runs on it
	hostRoot   int  // the root's rank on its host, on that host; 0 (the leader) on the others
}

func (x *hierBroadcast) piece(p int) span {
	return evenSpan(len(x.buf)/x.es, x.es, x.pieces, p)
}

func (x *hierBroadcast) run() error {
	var kids [64]int
	var parent int
	var children []int
	var incoming [hierPieces][]*recvReq
	if x.lo != nil {
		algo := chooseBroadcast(x.lv.topology(), len(x.buf)) // the leaders share no memory: tree or chain
		parent, children = broadcastRoute(algo, x.lv.rank, x.rootHost, x.lv.size(), kids[:0])
		if !x.onRootHost {
			for p := range x.pieces {
				pc := x.piece(p)
				incoming[p] = x.lo.expect(parent, pc.of(x.buf), pc.off)
			}
		}
	}
	for p := range x.pieces {
		pc := x.piece(p)
		if x.onRootHost {
			if err := x.host(pc); err != nil {
				return err
			}
		}
		if x.lo != nil {
			if err := x.lv.viewErr(x.forward(pc, incoming[p], children)); err != nil {
				return err
			}
		}
		if !x.onRootHost {
			if err := x.host(pc); err != nil {
				return err
			}
		}
	}
	return nil
}

// forward sends piece pc to the leader's children in the tree: at once
// from the root's host, else each segment as it lands (incoming).
func (x *hierBroadcast) forward(pc span, incoming []*recvReq, children []int) error {
	if x.onRootHost {
		for _, child := range children {
			if err := x.lo.send(child, pc.of(x.buf), pc.off); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range incoming {
		if err := x.lo.await(r); err != nil {
			return err
		}
		for _, child := range children {
			if err := x.lo.send(child, r.buf, int(r.want.offset)); err != nil {
				return err
			}
		}
	}
	return nil
}

// host copies piece pc from the host's root to its other ranks.
func (x *hierBroadcast) host(pc span) error {
	if x.hv.size() == 1 {
		return nil
	}
	if x.lo != nil {
		x.lo.handoff() // the writers carry the leaders' frames meanwhile
	}
	return x.hv.viewErr(x.ho.broadcastInView(pc.of(x.buf), x.hostRoot))
}

package collective

// The hierarchical all_reduce in two dimensions. With k ranks on each of
// H hosts, the buffer's host sum is cut into k chunks, one per local
// rank, and each local rank carries its chunk across the hosts with the
// ranks of its rail (its local index on every host):
//
//  1. reduce-scatter in the host's shared memory: local rank l gets the
//     host's sum of chunk l;
//  2. all-reduce of chunk l among rail l over TCP: the chunk is cut into
//     H parts, rail rank j reduces part j from every host's sum (sent
//     to it directly) and sends the result back to every host;
//  3. all-gather in the host's shared memory: every local rank gets
//     every chunk.
//
// Each host's link carries 2(H-1)/H of the buffer each way, as with one
// leader per host, but spread over the streams of k ranks instead of
// one. The buffer goes through in pieces, and the phases of successive
// pieces overlap. In step p a rank reduce-scatters piece p and sends its
// sums; reduces its parts of piece p-1 and sends the results; and only
// then waits for the results of piece p-2 and all-gathers it. So while it
// waits, and while its host works, the link still carries piece p's sums
// and piece p-1's results. Waiting for piece p-1's results in step p, as
// it did, left the link idle through every shared-memory phase: on 4
// shaped hosts of 2 ranks, 16 and 64 MiB went from 71% of the link's
// bound to 84 and 90%; on 2 hosts, 64 MiB from 79 to 89%.
//
// Hosts that run different numbers of ranks use as many rails as the
// smallest runs (hierarchy.minLocal); the other ranks own no chunk: they
// add their data in phase 1 and get the result in phase 3.
//
// Every element is computed once, by one rail rank, from the host sums
// in host order (each host sum in local-rank order), and copied to every
// other rank: all ranks get the same bits.

const (
	// hierPieces is how many pieces a hierarchical collective cuts a
	// large buffer into, so that the phases of one piece overlap those of
	// the next (the 2D all_reduce more, to keep them to hierPieceMax).
	hierPieces = 8
	// hierPieceMin is the smallest piece: below it the shared-memory
	// phases' synchronisations cost more than the overlap saves. On 2
	// shaped hosts of 2 ranks at 500 Mbit/s, on 2 loaded cores, 1 MiB in
	// one piece reached 0.077 GB/s busbw and in 4 pieces 0.048.
	hierPieceMin = 1 << 20
	// hierPieceMax is the largest piece of the 2D all_reduce. A rail
	// rank sends each rail peer 1/(rails x hosts) of a piece at once,
	// over as many of the pair's streams as it has segments; from every
	// peer of every rail together, that burst overflows a shaped link's
	// queue, and the streams that lose packets stall. 4 hosts of 2 ranks
	// at 500 Mbit/s, 64 MiB, runs interleaved: pieces of 8 MiB 3.27 and
	// 2.89 s with about 2900 packets dropped per run, of 2 MiB 2.40 and
	// 2.21 s with 40 (one stream per pair and 8 MiB: 2.25 s, none).
	hierPieceMax = 2 << 20
	// hierRailDoublingMax: a buffer of one piece whose chunk is at most
	// this goes across the rail by recursive doubling (log2 H rounds of
	// the whole chunk) rather than by parts (two rounds of 1/H each): at
	// 64 KiB, 0.035 GB/s busbw against 0.020 in the same runs.
	hierRailDoublingMax = 64 << 10
	// railDepth is how many pieces of the 2D all_reduce hold buffers at
	// once: piece p's sum is sent in step p, and the results that show
	// the peers have it all are awaited in step p+2.
	railDepth = 3
)

// piecesOf is how many pieces a hierarchical collective cuts n bytes
// into.
func piecesOf(n int) int { return max(1, min(hierPieces, n/hierPieceMin)) }

// railPiecesOf is how many pieces the 2D all_reduce cuts n bytes into:
// piecesOf, or more where a piece would be over hierPieceMax.
func railPiecesOf(n int) int { return max(piecesOf(n), ceilDiv(n, hierPieceMax)) }

// railReduce is one 2D all_reduce in flight on this rank.
type railReduce struct {
	buf       []byte
	es, count int
	pieces    int
	ho, ro    *op // the host's and the rail's parts of the call; ro nil off the rails
	hv, rv    *comm
	rails     int // chunks per piece: the rails every host has
	local     int // this rank's index on its host
	hostSum   [railDepth][]byte
	operands  [railDepth][]byte       // the parts of the other hosts' sums this rank reduces
	posted    [railDepth][][]*recvReq // piece p's operand receives from each rail rank, at p%railDepth
	chunks    []span                  // the host ranks' chunks of the piece at hand
}

// allReduceHierarchical runs the 2D all_reduce above, or, for buffers
// of up to hierLeadersMax or where hosts' ranks share no memory
// (GORUN_TRANSPORT=unix), reduces buf at each host's leader, across the
// leaders, and back to each host. (A host whose shared memory could not
// be set up where the others' was goes through its leader alone: its
// frames then fail the call with a mismatch rather than a wrong sum.)
func (o *op) allReduceHierarchical(buf []byte) error {
	h := o.c.hier
	if !byRails(h.twoD && (h.host.size() == 1 || h.host.shared()), len(buf)) {
		return o.allReduceByLeaders(buf)
	}
	x := &h.reduce // reused, to allocate nothing
	*x = railReduce{
		buf:    buf,
		es:     o.hdr.dtype.Size(),
		pieces: railPiecesOf(len(buf)),
		hv:     h.host,
		rails:  h.minLocal(),
		local:  h.localOf[o.c.rank],
		chunks: x.chunks,
		posted: x.posted,
	}
	x.count = len(buf) / x.es
	x.ho = x.hv.join(o)
	if x.local < x.rails {
		x.rv = h.rail
		x.ro = x.rv.join(o)
	}
	err := x.run()
	if x.ro != nil {
		err = x.rv.settle(x.ro, err)
	}
	err = x.hv.settle(x.ho, err)
	for i := range x.posted {
		clear(x.posted[i])
	}
	x.buf = nil
	return err
}

// byRails says whether a hierarchical all_reduce of n bytes runs the 2D
// form, which needs every host's ranks to share memory (shared); else
// it goes through the hosts' leaders.
func byRails(shared bool, n int) bool { return shared && n > hierLeadersMax }

// piece is piece p of the buffer.
func (x *railReduce) piece(p int) span { return evenSpan(x.count, x.es, x.pieces, p) }

// chunksOf sets x.chunks to the host ranks' chunks of piece pc, relative
// to it, and returns this rank's.
func (x *railReduce) chunksOf(pc span) span {
	k := x.hv.size()
	if cap(x.chunks) < k {
		x.chunks = make([]span, k)
	}
	x.chunks = x.chunks[:k]
	for l := range k {
		x.chunks[l] = span{pc.len, 0}
		if l < x.rails {
			x.chunks[l] = evenSpan(pc.len/x.es, x.es, x.rails, l)
		}
	}
	return x.chunks[x.local]
}

// part is rail rank j's part of a chunk of n bytes, relative to it.
func (x *railReduce) part(n, j int) span { return evenSpan(n/x.es, x.es, x.rv.size(), j) }

func (x *railReduce) run() error {
	if x.ro != nil {
		// The first piece's first chunk and part are the longest.
		chunk := x.chunksOf(x.piece(0)).len
		part := x.part(chunk, 0).len
		for i := range min(railDepth, x.pieces) {
			x.hostSum[i] = x.ro.scratch(chunk)
			x.operands[i] = x.ro.scratch(part * x.rv.size())
			if len(x.posted[i]) < x.rv.size() {
				x.posted[i] = make([][]*recvReq, x.rv.size())
			}
		}
	}
	if x.pieces == 1 && x.ro != nil {
		x.chunksOf(x.piece(0))
		if x.chunks[0].len <= hierRailDoublingMax { // the same choice on every rail
			return x.small()
		}
	}
	for p := range x.pieces {
		if err := x.reduceScatter(p); err != nil {
			return err
		}
		if x.ro != nil {
			if err := x.sendSums(p); err != nil {
				return err
			}
			if p > 0 {
				if err := x.railErr(x.reduceParts(p - 1)); err != nil {
					return err
				}
			}
		}
		if p > 1 {
			if err := x.finish(p - 2); err != nil {
				return err
			}
		}
	}
	if x.ro != nil {
		x.expectResults(x.pieces - 1)
		if err := x.railErr(x.reduceParts(x.pieces - 1)); err != nil {
			return err
		}
	}
	for p := max(x.pieces-2, 0); p < x.pieces; p++ {
		if err := x.finish(p); err != nil {
			return err
		}
	}
	return nil
}

// small is a buffer of one piece whose chunks are small: the rail
// all-reduces each by recursive doubling, in place.
func (x *railReduce) small() error {
	pc := x.piece(0)
	in := pc.of(x.buf)
	mine := x.chunksOf(pc)
	if err := x.hostReduceScatter(mine.of(in), in); err != nil {
		return err
	}
	if err := x.railErr(x.ro.allReduceDoubling(mine.of(in))); err != nil {
		return err
	}
	return x.hostAllGather(in)
}

// reduceScatter reduces piece p across the host into this rank's sum of
// its chunk.
func (x *railReduce) reduceScatter(p int) error {
	pc := x.piece(p)
	mine := x.chunksOf(pc)
	var out []byte
	if x.ro != nil {
		out = x.hostSum[p%railDepth][:mine.len]
	}
	return x.hostReduceScatter(out, pc.of(x.buf))
}

// hostReduceScatter reduces in across the host into out, this rank's
// chunk of it (x.chunks).
func (x *railReduce) hostReduceScatter(out, in []byte) error {
	if x.hv.size() == 1 {
		if !overlaps(out, in) {
			copy(out, x.chunks[0].of(in))
		}
		return nil
	}
	x.handoff()
	return x.hostErr(x.ho.reduceScatterShared(out, in, x.chunks))
}

// hostAllGather copies every host rank's chunk of in to the others.
func (x *railReduce) hostAllGather(in []byte) error {
	if x.hv.size() == 1 {
		return nil
	}
	x.handoff()
	return x.hostErr(x.ho.allGatherSpans(in, x.chunks))
}

// sendSums posts the receives of piece p's operands (and of the previous
// piece's results, which the peers send after these operands) and sends
// each rail rank its part of this rank's sum.
func (x *railReduce) sendSums(p int) error {
	pc := x.piece(p)
	mine := x.chunksOf(pc)
	at := pc.off + mine.off
	n, me := x.rv.size(), x.rv.rank
	own := x.part(mine.len, me)
	for i := range n - 1 {
		j := orderAfter(me, n, i)
		x.posted[p%railDepth][j] = x.ro.expectOperand(j, x.operands[p%railDepth][j*own.len:][:own.len], at+own.off)
	}
	if p > 0 {
		x.expectResults(p - 1)
	}
	for i := range n - 1 {
		j := orderAfter(me, n, i)
		part := x.part(mine.len, j)
		if err := x.railErr(x.ro.send(j, part.of(x.hostSum[p%railDepth]), at+part.off)); err != nil {
			return err
		}
	}
	return nil
}

// expectResults posts the receives of piece p's results, straight into
// place.
func (x *railReduce) expectResults(p int) {
	pc := x.piece(p)
	mine := x.chunksOf(pc)
	at := pc.off + mine.off
	n, me := x.rv.size(), x.rv.rank
	for i := range n - 1 {
		j := orderAfter(me, n, i)
		part := x.part(mine.len, j)
		x.ro.expect(j, part.of(x.buf[at:]), at+part.off)
	}
}

// finish ends piece p: this rank waits for the other parts of its chunk
// from the rail, and the host all-gathers the piece.
func (x *railReduce) finish(p int) error {
	pc := x.piece(p)
	mine := x.chunksOf(pc) // and the all-gather's spans
	if x.ro != nil {
		if err := x.railErr(x.awaitResults(pc.off+mine.off, mine.len)); err != nil {
			return err
		}
	}
	return x.hostAllGather(pc.of(x.buf))
}

// handoff has the writer goroutines write the rail's queued frames
// before this rank waits in shared memory: a rail peer may wait for them
// while its host peer waits for it, and ours for us.
func (x *railReduce) handoff() {
	if x.ro != nil {
		x.ro.handoff()
	}
}

// reduceParts reduces this rank's part of piece p's chunk segment by
// segment as the operands come, and sends each segment of the result to
// the rail.
func (x *railReduce) reduceParts(p int) error {
	pc := x.piece(p)
	mine := x.chunksOf(pc)
	at, n := pc.off+mine.off, mine.len
	ro := x.ro
	ranks, me := x.rv.size(), x.rv.rank
	own := x.part(n, me)
	result := own.of(x.buf[at:])
	sum := own.of(x.hostSum[p%railDepth])
	seg := ro.segment()
	var operands [maxFused][]byte
	srcs := operands[:0]
	if ranks > maxFused {
		srcs = make([][]byte, 0, ranks)
	}
	for s := range ro.segments(own.len) {
		lo := s * seg
		hi := min(lo+seg, own.len)
		srcs = srcs[:0]
		for j := range ranks {
			if j == me {
				srcs = append(srcs, sum[lo:hi])
				continue
			}
			r := x.posted[p%railDepth][j][s]
			if err := ro.await(r); err != nil {
				return err
			}
			srcs = append(srcs, r.buf)
		}
		if hi > lo {
			reduceMany(result[lo:hi], nil, srcs, ro.hdr.dtype, ro.hdr.reduce)
		}
		for i := range ranks - 1 {
			j := orderAfter(me, ranks, i)
			if err := ro.send(j, result[lo:hi], at+own.off+lo); err != nil {
				return err
			}
		}
	}
	return nil
}

// awaitResults waits for the rail's results of the chunk at byte at of
// the buffer, n long; they come in the order the receives were posted.
func (x *railReduce) awaitResults(at, n int) error {
	ro := x.ro
	for _, r := range ro.recvs {
		if !r.consumed && r.want.offset >= uint64(at) && r.want.offset < uint64(at+max(n, 1)) {
			if err := ro.await(r); err != nil {
				return err
			}
		}
	}
	return nil
}

func (x *railReduce) hostErr(err error) error { return x.hv.viewErr(err) }
func (x *railReduce) railErr(err error) error { return x.rv.viewErr(err) }

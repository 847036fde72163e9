package collective

// The leaders' forms of the hierarchical collectives, for small buffers:
// each host's ranks meet at their leader in shared memory, only the
// leaders talk across hosts, and each leader hands the result back to
// its host. A small buffer gains nothing from spreading its bytes over
// every rail, and on hosts whose cores the ranks share, each rank that
// talks across costs system calls and wake-ups. Each form's choice
// goes by a length every rank shares (the whole all_reduce, the gathered
// buffer, the reduced input), so all choose alike.

// hierLeadersMax is the largest all_reduce that goes through the leaders
// (reduced to them, all-reduced across them, broadcast back) rather than
// the 2D form's rails (byRails). 4 shaped hosts of 2 ranks at 500
// Mbit/s, rounds interleaved, medians, leaders against rails (Open MPI):
// 8 B 287 against 560 us (366), 64 KiB 1,654 against 2,202 (1,664),
// 96 KiB 2,477 against 3,297 (2,479), 128 KiB 4,578 against 8,150
// (3,305); at 256 KiB the rails won (6.6 against 9.9 ms). On 2 hosts at
// 2 Gbit/s the two forms measure alike from 8 B to 1 MiB.
const hierLeadersMax = 128 << 10

// hierLeadersMovementMax is the largest all_gather (the gathered buffer)
// and reduce_scatter (its input) that goes through the leaders. On 4
// shaped hosts of 2 ranks at 500 Mbit/s, 5 rounds interleaved, medians,
// leaders against rails (Open MPI), us a call: all_gather 8 B 323
// against 455 (281), 4 KiB 271 against 364 (342); reduce_scatter 8 B
// 337 against 415 (324), 4 KiB 280 against 414 (355); alike at 32 and
// 64 KiB, where the link's time dominates, and at 128 KiB the leaders'
// single streams lost some runs. On 2 hosts at 2 Gbit/s, all_gather 8 B
// 69 against 96 (74).
const hierLeadersMovementMax = 64 << 10

// byLeaders says whether a hierarchical all_gather or reduce_scatter of
// n bytes goes through the hosts' leaders rather than the rails.
func byLeaders(n int) bool { return n <= hierLeadersMovementMax }

// allReduceByLeaders reduces buf on each host at its leader, across the
// leaders, and back to each host.
func (o *op) allReduceByLeaders(buf []byte) error {
	h := o.c.hier
	if err := h.host.reduceToLeader(o, buf); err != nil {
		return err
	}
	if h.leaders != nil {
		lo := h.leaders.join(o)
		var err error
		switch h.leaders.allReduceAlgorithm(len(buf)) {
		case algoRD:
			err = lo.allReduceDoubling(buf)
		case algoRHD:
			err = lo.allReduceHalving(buf)
		default:
			err = lo.allReduceRing(buf)
		}
		if err = h.leaders.leave(lo, err); err != nil {
			return err
		}
	}
	return h.host.broadcastFromLeader(o, buf)
}

// allGatherByLeaders gathers each host's blocks at its leader, the host
// blocks across the leaders (Bruck's, whose rounds grow as log2 of the
// hosts), and hands the whole to each host. The leaders gather in the
// grid's order, host by host; where that is not the ranks' order
// ({0, 1, 0, 1}), they put the blocks in place before handing them out.
func (o *op) allGatherByLeaders(out, in []byte) error {
	g, h, size := o.c.grid, o.c.hier, len(in)
	byGrid := out
	if !g.inRankOrder {
		byGrid = o.scratch(len(out))
	}
	hostBlocks := byGrid[g.host*g.local*size:][:g.local*size]
	ho := h.host.join(o)
	if err := h.host.leave(ho, ho.allGatherShared(hostBlocks, in, 0)); err != nil {
		return err
	}
	if h.leaders != nil {
		lo := h.leaders.join(o)
		if err := h.leaders.leave(lo, lo.bruckAllGather(byGrid, hostBlocks)); err != nil {
			return err
		}
		if !g.inRankOrder {
			for i, r := range g.ranks {
				copy(out[r*size:][:size], byGrid[i*size:][:size])
			}
		}
	}
	return h.host.broadcastFromLeader(o, out)
}

// reduceScatterByLeaders reduces in at each host's leader; each leader
// sends every other host's leader that host's chunks of its sum (its
// ranks' chunks in the grid's order, one message), adds up what the
// other leaders send for its own host's chunks, in host order, and
// hands them to its host, where each rank keeps its chunk.
func (o *op) reduceScatterByLeaders(out, in []byte, chunks []span) error {
	g, h := o.c.grid, o.c.hier
	// Host k's chunks, packed in the grid's order: hostLen(k) bytes.
	hostLen := func(k int) (n int) {
		for j := range g.local {
			n += chunks[g.at(k, j)].len
		}
		return n
	}
	mine := hostLen(g.host)
	sum := o.scratch(len(in) + mine)
	copy(sum, in)
	hostSum, result := sum[:len(in)], sum[len(in):]
	if err := h.host.reduceToLeader(o, hostSum); err != nil {
		return err
	}
	if h.leaders != nil {
		lo := h.leaders.join(o)
		if err := h.leaders.leave(lo, lo.exchangeHostChunks(result, hostSum, chunks, hostLen)); err != nil {
			return err
		}
	}
	if err := h.host.broadcastFromLeader(o, result); err != nil {
		return err
	}
	off := 0
	for j := range g.index {
		off += chunks[g.at(g.host, j)].len
	}
	copy(out, result[off:][:len(out)])
	return nil
}

// exchangeHostChunks is reduceScatterByLeaders' part on the leaders'
// view o.c (whose rank k is host k's leader): result gets the sum, over
// the hosts in order, of every host's hostSum at this host's chunks.
func (o *op) exchangeHostChunks(result, hostSum []byte, chunks []span, hostLen func(k int) int) error {
	g, H, me := o.c.parent.grid, o.c.size(), o.c.rank
	pack := func(dst []byte, k int) {
		off := 0
		for j := range g.local {
			off += copy(dst[off:], chunks[g.at(k, j)].of(hostSum))
		}
	}
	mine := len(result)
	theirs := o.scratch((H - 1) * mine)
	from := func(k int) []byte {
		if k > me {
			k--
		}
		return theirs[k*mine:][:mine]
	}
	first := len(o.recvs)
	for k := range H {
		if k != me {
			o.expect(k, from(k), 0)
		}
	}
	for k := range H {
		if k != me {
			packed := o.scratch(hostLen(k))
			pack(packed, k)
			if err := o.send(k, packed, 0); err != nil {
				return err
			}
		}
	}
	if err := o.awaitAll(o.recvs[first:]); err != nil {
		return err
	}
	own := o.scratch(len(result))
	pack(own, me)
	part := func(k int) []byte {
		if k == me {
			return own
		}
		return from(k)
	}
	// In host order, as every hierarchical form adds.
	copy(result, part(0))
	for k := 1; k < H; k++ {
		o.combine(result, result, part(k))
	}
	return nil
}

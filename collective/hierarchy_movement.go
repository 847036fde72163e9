package collective

import (
	"cmp"
	"encoding/binary"
	"errors"
	"slices"
)

// Hierarchical forms of all_gather and reduce_scatter, for a world that
// spans hosts where every host runs the same number of ranks (a grid).
// Between hosts, only the ranks that share a local index talk (a rail:
// host h's j-th rank with every other host's j-th); within a host, the
// ranks meet in shared memory. Every byte that must cross from one host
// to another then crosses once: a host sends (hosts-1)/hosts of the
// reduced buffer in a reduce_scatter and receives (hosts-1) x local
// blocks in an all_gather, where the flat ring, whose every link carries
// (n-1)/n of the buffer, crosses each host's link with all but one
// rank's share: (n-1)/(n-local) times more, 1.5x on 2 hosts of 2 ranks.
//
// The network runs in the world's op, straight between the rail's ranks
// (their receives posted into place before anything is sent); the
// shared-memory part runs in the host view's (hierarchy.go), a window of
// every rail's data per block, so that the two overlap: an all_gather
// hands each window to the host as soon as the rail has brought it, a
// reduce_scatter sends each window as soon as the host has reduced it.
// Within a host the frames of the world's op and of the view's never
// meet: the one talks only to other hosts, the other only to this one.

// grid lays a hierarchical world out as hosts x local ranks: ranks[h*local+j]
// is the world rank of host h's j-th rank (ascending), hosts in the order of
// their leaders.
type grid struct {
	hosts, local int
	ranks        []int
	host, index  int // this rank's host and its index there
	// inRankOrder says ranks[i] == i: each host runs a run of
	// consecutive ranks, as launchers place them.
	inRankOrder bool
}

// newGrid is the grid of hierarchy h for world rank me, or nil when the
// hosts run different numbers of ranks or share no memory: the
// hierarchical movement forms need both.
func newGrid(h *hierarchy, me int) *grid {
	if h == nil || !h.twoD || !h.host.shared() {
		return nil
	}
	local := len(h.hostRanks[0])
	g := &grid{hosts: len(h.hostRanks), local: local, host: h.hostOf(me), index: h.localOf[me]}
	for _, rs := range h.hostRanks {
		if len(rs) != local {
			return nil
		}
		g.ranks = append(g.ranks, rs...)
	}
	g.inRankOrder = slices.IsSorted(g.ranks)
	return g
}

// at is the world rank of host h's j-th rank.
func (g *grid) at(h, j int) int { return g.ranks[h*g.local+j] }

// chooseAllGather is the all_gather algorithm for n bytes (gathered)
// on t, over sockets (AllGather takes shared memory when t.shared): by
// hosts on a grid, else Bruck's for small buffers of 4 ranks or more
// and the ring above.
func chooseAllGather(t topology, n int) algorithm {
	switch {
	case t.grid && n >= hierMovementMin:
		return algoHier
	case t.ranks >= 4 && n <= allGatherBruckMax:
		return algoBruck
	}
	return algoRing
}

// chooseReduceScatter is the reduce_scatter algorithm for n bytes (the
// input) on t.
func chooseReduceScatter(t topology, n int) algorithm {
	switch {
	case t.shared:
		return algoShm
	case t.grid && n >= hierMovementMin:
		return algoHier
	case n <= reduceScatterDoublingMax:
		return algoRD
	}
	return algoRing
}

// chooseAllToAll is the all_to_all algorithm on t.
func chooseAllToAll(t topology) algorithm {
	switch {
	case t.shared:
		return algoShm
	case t.grid && hierAllToAll:
		return algoHier
	}
	return algoDirect
}

// hierMovementMin is the smallest buffer (the gathered one of an
// all_gather, the input of a reduce_scatter) that goes by hosts on a
// grid; hierAllToAll says all_to_all does. On 2 and 4 hosts of 2 ranks
// joined by shaped links (bench/links.py), the hierarchical forms never
// lost by more than the runs' noise at 1 MiB to 64 MiB, but all_to_all's
// at 1 MiB on 4 hosts (0.86 to 0.89x the flat exchange; 0.90 to 0.97x
// since its large pieces go alone, goesAlone), which it beats at 8 bytes
// and 64 KiB: see the README. all_to_all goes by the topology alone
// (allToAllAlgorithm), so one choice serves every size.
const (
	hierMovementMin = 0
	hierAllToAll    = true
)

// goesAlone says whether an all_to_all piece of n bytes between ranks of
// a world on hosts hosts goes straight to its receiver rather than
// through the slots and the rails (allToAllHierarchical): one of
// allToAllAloneMin bytes or more, when there are more than 2 hosts.
// Measured on shaped links (bench/links.py), interleaved rounds: on 4
// hosts at 500 Mbit/s, a 1 MiB call (128 KiB pieces) took 28.7 ms with
// the pieces for other hosts alone, 31.6 through the rails, 27.8 by the
// flat exchange (8 rounds); 8 bytes to 256 KiB (pieces of 32 KiB) and
// 16 MiB measured alike. With the pieces within a host alone too, and
// the slots skipped, 29.3 against 31.0 and the flat exchange's 27.5
// (8 rounds, a loaded machine). On 2 hosts at 2 Gbit/s the rails won at
// every size: 256 KiB 1.12 ms against 1.43 alone, 1 MiB 4.6 against
// 5.0 (10 rounds). 3 hosts are unmeasured.
func goesAlone(n, hosts int) bool { return hosts > 2 && n >= allToAllAloneMin }

const allToAllAloneMin = 32 << 10

// allGatherHierarchical gathers every rank's in into out: the rail's
// blocks across hosts, then every rail's within the host; a small out
// through the leaders (byLeaders).
func (o *op) allGatherHierarchical(out, in []byte) error {
	if byLeaders(len(out)) {
		return o.allGatherByLeaders(out, in)
	}
	g, size := o.c.grid, len(in)
	block := func(r int) []byte { return out[r*size:][:size] }
	// Receives first: the rail's blocks land in place.
	first := len(o.recvs)
	for h := range g.hosts {
		if h != g.host {
			peer := g.at(h, g.index)
			o.expect(peer, block(peer), 0)
		}
	}
	for h := range g.hosts {
		if h != g.host {
			if err := o.send(g.at(h, g.index), in, 0); err != nil {
				return err
			}
		}
	}
	o.handoff() // the writers send while we work in shared memory
	copy(block(o.c.rank), in)
	hv := o.c.hier.host
	ho := hv.join(o)
	var werr error // the world op's, in its terms already
	err := hv.leave(ho, ho.gatherRails(o, out, size, o.recvs[first:], &werr))
	return cmp.Or(werr, err)
}

// errWorldPhase ends a host view's part when the world op's part failed,
// with an error the world op returns itself (in world terms, which the
// view's leave would take for its own).
var errWorldPhase = errors.New("collective: the world's part failed")

// gatherRails is all_gather's part in host view o.c: block by block,
// every rank copies a window of its rail's blocks (rail j's, on the j-th
// rank) into its slot, once the world op wo has received them (recvs,
// segment by segment, host by host without this one), and copies every
// peer's into out. A failure of wo goes to werr.
func (o *op) gatherRails(wo *op, out []byte, size int, recvs []*recvReq, werr *error) error {
	g := wo.c.grid
	sub := subSlot(o.c.shm.slot, g.hosts)
	rounds := roundsFor(size, sub)
	segs := wo.segments(size)
	landed := 0 // segments of every remote block awaited
	return o.runShared(func(s *shmWorld) error {
		for k := range rounds {
			w := window(span{0, size}, k, sub)
			need := ceilDiv(w.off+w.len, wo.segment())
			if k == rounds-1 {
				need = segs
			}
			for ; landed < need; landed++ {
				for i := range g.hosts - 1 {
					if err := wo.await(recvs[i*segs+landed]); err != nil {
						*werr = err
						return errWorldPhase
					}
				}
			}
			b := s.next()
			slot, err := o.claimSlot(b)
			if err != nil {
				return err
			}
			for h := range g.hosts {
				copyCached(slot[h*sub:], w.of(out[g.at(h, g.index)*size:]))
			}
			o.signalWritten(b)
			err = o.eachWritten(b, func(peer int) error {
				theirs := o.slotOf(peer, b)
				for h := range g.hosts {
					copyCached(w.of(out[g.at(h, peer)*size:]), theirs[h*sub:][:w.len])
				}
				return nil
			})
			if err != nil {
				return err
			}
			o.signalConsumed(b)
		}
		return nil
	})
}

// reduceScatterHierarchical reduces in across the ranks into out, which
// gets chunks[me] of the result: each host reduces, in shared memory,
// the chunks of rail j at its j-th rank, which sends each other host's
// to its rank of the rail as the windows are done and reduces what the
// rail sends it into out. A small in goes through the leaders
// (byLeaders).
func (o *op) reduceScatterHierarchical(out, in []byte, chunks []span) error {
	if byLeaders(len(in)) {
		return o.reduceScatterByLeaders(out, in, chunks)
	}
	g, me := o.c.grid, o.c.rank
	hv := o.c.hier.host
	sub := subSlot(hv.shm.slot, g.hosts*g.local)
	longest := 0
	for _, c := range chunks {
		longest = max(longest, c.len)
	}
	rounds := roundsFor(longest, sub)
	// partial[h] is this host's reduction of the chunk of rail rank h,
	// in work; theirs[h] the other hosts' of ours, in scratch.
	mine := chunks[me]
	railChunk := func(h int) span { return chunks[g.at(h, g.index)] }
	total := 0
	for h := range g.hosts {
		total += railChunk(h).len
	}
	work := o.scratch(total + (g.hosts-1)*mine.len)
	partial := func(h int) []byte {
		off := 0
		for i := range h {
			off += railChunk(i).len
		}
		return work[off:][:railChunk(h).len]
	}
	theirs := func(h int) []byte {
		i := h
		if h > g.host {
			i--
		}
		return work[total+i*mine.len:][:mine.len]
	}
	// A window goes in one message, posted before any is sent; an empty
	// chunk still exchanges one (empty) frame, in the first round.
	sends := func(c span, k int) (span, bool) {
		w := window(span{0, c.len}, k, sub)
		return w, w.len > 0 || k == 0
	}
	first := len(o.recvs)
	for k := range rounds {
		w, ok := sends(mine, k)
		if !ok {
			break
		}
		for h := range g.hosts {
			if h != g.host {
				o.expect(g.at(h, g.index), w.of(theirs(h)), w.off)
			}
		}
	}
	ho := hv.join(o)
	var werr error // the world op's, in its terms already
	err := ho.runShared(func(s *shmWorld) error {
		for k := range rounds {
			b := s.next()
			slot, err := ho.claimSlot(b)
			if err != nil {
				return err
			}
			for j := range g.local {
				if j == g.index {
					continue
				}
				for h := range g.hosts {
					c := chunks[g.at(h, j)]
					copyCached(slot[(j*g.hosts+h)*sub:], window(c, k, sub).of(in))
				}
			}
			ho.signalWritten(b)
			for h := range g.hosts {
				c := railChunk(h)
				w := window(c, k, sub)
				dst := partial(h)[w.off-c.off:][:w.len]
				if err := ho.reduceChunk(b, dst, nil, span{(g.index*g.hosts + h) * sub, w.len}, w.of(in)); err != nil {
					return err
				}
			}
			ho.signalConsumed(b)
			for h := range g.hosts {
				if h == g.host {
					continue
				}
				if w, ok := sends(railChunk(h), k); ok {
					if err := o.send(g.at(h, g.index), w.of(partial(h)), w.off); err != nil {
						werr = err
						return errWorldPhase
					}
				}
			}
			o.handoff()
		}
		return nil
	})
	if err = cmp.Or(werr, hv.leave(ho, err)); err != nil {
		return err
	}
	// The rail's partials, window by window as they land, host by host.
	own := partial(g.host)
	next := first
	for k := range rounds {
		w, ok := sends(mine, k)
		if !ok {
			break
		}
		acc := w.of(out)
		copy(acc, w.of(own))
		for h := range g.hosts {
			if h == g.host {
				continue
			}
			for range o.segments(w.len) {
				if err := o.await(o.recvs[next]); err != nil {
					return err
				}
				next++
			}
			o.combine(acc, acc, w.of(theirs(h)))
		}
	}
	return nil
}

// countsKey hashes a reduce_scatter's counts into its frames' and
// published calls' root field, which the collective has no other use
// for: ranks that split the same total differently then fail with a
// mismatch, where the hierarchical form's blocks and windows, cut by the
// counts, would leave them waiting for each other. all_to_all's rails
// hash the counts their messages stand for the same way.
func countsKey(counts []int) int32 {
	h := uint32(2166136261) // FNV-1a, a byte of each count's eight at a time
	for _, n := range counts {
		for i := range 8 {
			h = (h ^ uint32(byte(uint64(n)>>(8*i)))) * 16777619
		}
	}
	return int32(h)
}

// allToAllHierarchical sends piece sends[d] of in to every rank d and
// receives rank s's for us into recvs[s] of out, aggregated by host: in
// shared memory, the j-th rank of each host collects its host's pieces
// for rail j (and every rank its own host's pieces for it), and sends
// each other host's rank of the rail the host's pieces for it, window by
// window as they are collected; that rank receives them straight into
// place. Between hosts, each rank then talks to hosts-1 peers instead
// of n-local, in fewer and larger messages. The host's ranks share
// their send counts in the first round's slots, ahead of the pieces, so
// that each knows what its peers hand it: a small call meets once (on 4
// shaped hosts, 8 bytes took 709 us with the counts in a meeting of
// their own, 551 in the slots; Open MPI 406).
//
// Between more than 2 hosts, a piece of allToAllAloneMin bytes or more
// gains nothing from the rail: it goes alone, straight from its sender
// to its receiver as the flat exchange sends it (to a rank of its own
// host too), queued before the host's ranks meet, so that a rank early
// to the call keeps the link busy. Both ends tell such a piece by its
// length (goesAlone). Where no piece of the host's goes through the
// slots, its ranks meet only to share their counts. The rails carry the
// other pieces, in frames whose root field hashes the counts of every
// piece from the host to the receiver (countsKey), and at least one
// frame each, empty when every piece went alone: ranks whose counts
// disagree, and so may disagree on a piece's way, fail at once with a
// mismatch rather than wait for a frame that will not come.
func (o *op) allToAllHierarchical(out, in []byte, sends, recvs []span) error {
	g, n, es := o.c.grid, o.c.size(), o.hdr.dtype.Size()
	me, idx, H, L := o.c.rank, g.index, g.hosts, g.local
	hv, hier, call := o.c.hier.host, o.c.hier, o.hdr
	// alone says whether the piece between us and rank r, of n bytes,
	// goes alone.
	alone := func(r, n int) bool { return r != me && goesAlone(n, H) }
	// The pieces alone from our rail's ranks, then the others, in the
	// order they are waited for (see the end).
	fromRail := len(o.recvs)
	fromOthers := fromRail
	for _, rail := range []bool{true, false} {
		for s := 1; s < n; s++ {
			from := (me - s + n) % n
			if piece := recvs[from]; alone(from, piece.len) && (hier.localOf[from] == idx) == rail {
				o.hdr.count = uint64(piece.len / es)
				o.expect(from, piece.of(out), 0)
			}
		}
		if rail {
			fromOthers = len(o.recvs)
		}
	}
	for s := 1; s < n; s++ {
		to := (me + s) % n
		if piece := sends[to]; alone(to, piece.len) {
			o.hdr.count = uint64(piece.len / es)
			if err := o.send(to, piece.of(in), 0); err != nil {
				return err
			}
		}
	}
	o.hdr = call
	// Every host rank's piece lengths, in bytes: all[8*(j*n+d)] from the
	// host's j-th rank to world rank d, ours (own) among them. The ranks
	// share them in the first round's slots, ahead of the pieces, so that
	// a small call meets once; where a world is too large for that, in a
	// meeting of their own first.
	all := o.scratch(8 * n * L)
	own := all[8*n*idx:][:8*n]
	for d, s := range sends {
		binary.LittleEndian.PutUint64(own[8*d:], uint64(s.len))
	}
	length := func(j, d int) int { return int(binary.LittleEndian.Uint64(all[8*(j*n+d):])) }
	// The counts go first in the slot where it holds them beside a part
	// of 64 bytes or more for every rank (subSlot's least).
	slotBytes, tableBytes := hv.shm.slot, (8*n+63)&^63 // the pieces start on a cache line
	if tableBytes+64*L*H > slotBytes {
		tableBytes = 0
	}
	sub := subSlot(slotBytes-tableBytes, L*H)
	part := func(slot []byte, j, h int) []byte { return slot[tableBytes+(j*H+h)*sub:] }
	// railed says whether the host's j-th rank's piece for rank d goes
	// through the slots (and, for another host, the rails): one that does
	// not go alone, but a rank's own, which it copies itself.
	railed := func(j, d int) bool { return d != g.at(g.host, j) && !goesAlone(length(j, d), H) }
	// Messages between hosts go window by window, the host's ranks in
	// order within a window; an empty piece still sends one (empty)
	// frame, in the first, and a message of no piece one empty frame.
	carries := func(bytes, k int) (span, bool) {
		w := window(span{0, bytes}, k, sub)
		return w, w.len > 0 || k == 0
	}
	// The rails' messages for us, whose ways our own counts tell.
	counts := make([]int, L)
	railRecvs := len(o.recvs)
	for h := range H {
		if h == g.host {
			continue
		}
		peer := g.at(h, idx)
		for j := range L {
			counts[j] = recvs[g.at(h, j)].len / es
		}
		o.hdr.root = countsKey(counts)
		empty := true
		for k := 0; ; k++ {
			more := false
			for j := range L {
				from := g.at(h, j)
				piece := recvs[from]
				if alone(from, piece.len) {
					continue
				}
				if w, ok := carries(piece.len, k); ok {
					more, empty = true, false
					o.hdr.count = uint64(piece.len / es)
					o.expect(peer, w.of(piece.of(out)), w.off)
				}
			}
			if !more {
				break
			}
		}
		if empty {
			o.hdr.count = 0
			o.expect(peer, nil, 0)
		}
	}
	o.hdr = call
	// While the host's ranks meet, the view's waits write the pieces sent
	// alone, which nobody else would (op.sending): on 4 shaped hosts, a
	// 1 MiB call took 32 ms with them left for the world op to write once
	// the view was done, 28 ms with them handed to the writer goroutines
	// at the first wait, where the flat exchange took 27. (Handing every
	// world op's frames over at a view's wait, all_gather's too, made
	// the hierarchical 16 MiB all_gather 15% slower.)
	ho := hv.join(o)
	ho.sending = o
	if tableBytes == 0 {
		if err := ho.allGatherShared(all, own, -1); err != nil {
			return hv.leave(ho, err)
		}
	}
	// Once the counts are shared: the rounds of slots the host's pieces
	// take, and where this rank stages the host's pieces for its rail
	// rank at(h, idx) from the host's j-th rank, for j != idx (ours go
	// from in): at stagedAt[h*L+j].
	rounds := 1
	stagedAt := make([]int, H*L)
	var staging []byte
	plan := func() error {
		for j := range L {
			if from := g.at(g.host, j); j != idx && length(j, me) != recvs[from].len {
				return ho.pairMismatch(j, uint64(recvs[from].len/es), uint64(length(j, me)/es))
			}
			for d := range n {
				if railed(j, d) {
					rounds = max(rounds, roundsFor(length(j, d), sub))
				}
			}
		}
		stagedLen := 0
		for h := range H {
			for j := range L {
				if d := g.at(h, idx); h != g.host && j != idx && railed(j, d) {
					stagedAt[h*L+j] = stagedLen
					stagedLen += length(j, d)
				}
			}
		}
		staging = o.scratch(stagedLen)
		return nil
	}
	staged := func(h, j int) []byte {
		return staging[stagedAt[h*L+j]:][:length(j, g.at(h, idx))]
	}
	// sendRails sends round k's messages to our rail's ranks: the
	// windows of the host's pieces for them, and in the first round an
	// empty frame where no piece goes through the rail.
	sendRails := func(k int) error {
		for h := range H {
			if h == g.host {
				continue
			}
			peer := g.at(h, idx)
			for j := range L {
				counts[j] = length(j, peer) / es
			}
			o.hdr.root = countsKey(counts)
			empty := true
			for j := range L {
				if !railed(j, peer) {
					continue
				}
				empty = false
				piece := sends[peer].of(in)
				if j != idx {
					piece = staged(h, j)
				}
				if w, ok := carries(len(piece), k); ok {
					o.hdr.count = uint64(len(piece) / es)
					if err := o.send(peer, w.of(piece), w.off); err != nil {
						return err
					}
				}
			}
			if empty && k == 0 {
				o.hdr.count = 0
				if err := o.send(peer, nil, 0); err != nil {
					return err
				}
			}
		}
		return nil
	}
	var werr error // the world op's, in its terms already
	err := ho.runShared(func(s *shmWorld) error {
		for k := 0; k < rounds; k++ {
			b := s.next()
			slot, err := ho.claimSlot(b)
			if err != nil {
				return err
			}
			if k == 0 {
				copyCached(slot[:tableBytes], own)
			}
			for j := range L {
				if j == idx {
					continue
				}
				for h := range H {
					if d := g.at(h, j); railed(idx, d) {
						copyCached(part(slot, j, h), window(sends[d], k, sub).of(in))
					}
				}
			}
			ho.signalWritten(b)
			if k == 0 {
				copyCached(recvs[me].of(out), sends[me].of(in))
				if tableBytes > 0 {
					err := ho.eachWritten(b, func(j int) error {
						copy(all[8*n*j:][:8*n], ho.slotOf(j, b))
						return nil
					})
					if err != nil {
						return err
					}
				}
				if err := plan(); err != nil {
					return err
				}
			}
			err = ho.eachWritten(b, func(j int) error {
				theirs := ho.slotOf(j, b)
				for h := range H {
					d := g.at(h, idx)
					if !railed(j, d) {
						continue
					}
					w := window(span{0, length(j, d)}, k, sub)
					piece := part(theirs, idx, h)[:w.len]
					if h == g.host {
						copyCached(w.of(recvs[g.at(h, j)].of(out)), piece)
					} else {
						copyCached(w.of(staged(h, j)), piece)
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			ho.signalConsumed(b)
			if werr = sendRails(k); werr != nil {
				return errWorldPhase
			}
			o.handoff()
		}
		return nil
	})
	o.hdr = call // the call, as it ends, rather than its last frame
	if err = cmp.Or(werr, hv.leave(ho, err)); err != nil {
		return err
	}
	// Where counts disagree, the first frame from a rail's rank says so
	// at once (a piece alone against a rail's frame, or hashes that
	// differ), while a piece that one end thinks went alone may never
	// come: the pieces alone from the rail's ranks, then the rails'
	// frames, then the pieces alone from other ranks.
	for _, rs := range [][]*recvReq{o.recvs[fromRail:fromOthers], o.recvs[railRecvs:], o.recvs[fromOthers:railRecvs]} {
		if err := o.awaitAll(rs); err != nil {
			return err
		}
	}
	return nil
}

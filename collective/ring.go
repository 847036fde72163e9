package collective

// The ring primitives shared by all_reduce, reduce, reduce_scatter and
// all_gather. Rank r sends to r+1 and receives from r-1; chunk c of the
// buffer (chunks[c], one per rank) ends on rank c.

// ringSlots is how many received segments the reduce-scatter keeps posted
// ahead, so the next ones land in place while it reduces the current one.
const ringSlots = 8

// ringReduceScatter reduces buf in place until chunks[r] holds the
// reduction of every rank's chunk r on rank r (other chunks hold partial
// results). In step s rank r sends chunk r-s-1 (its own at step 0, else
// the one it reduced at step s-1) and receives chunk r-s-2, which it
// reduces into its own copy; each segment is forwarded as soon as it is
// reduced.
func (o *op) ringReduceScatter(buf []byte, chunks []span) error {
	n, me := o.c.size(), o.c.rank
	if n == 1 {
		return nil
	}
	next, prev := (me+1)%n, (me+n-1)%n
	chunk := func(i int) span { return chunks[((i%n)+n)%n] }

	// The segments we receive, in the order they come: step s brings
	// chunk me-s-2, a segment at a time. A cursor walks them.
	seg := o.segment()
	type cursor struct{ step, lo int }
	at := func(c cursor) span {
		ch := chunk(me - c.step - 2)
		return span{ch.off + c.lo, min(seg, ch.len-c.lo)}
	}
	advance := func(c cursor) cursor {
		if c.lo+seg < chunk(me-c.step-2).len {
			return cursor{c.step, c.lo + seg}
		}
		return cursor{c.step + 1, 0}
	}
	total := 0
	for s := range n - 1 {
		total += o.segments(chunk(me - s - 2).len)
	}
	first := chunk(me - 1)
	if err := o.send(next, first.of(buf), first.off); err != nil {
		return err
	}

	slots := min(ringSlots, total)
	scratch := o.scratch(slots * seg)
	var pending [ringSlots]*recvReq // segment j's receive is pending[j%slots]
	var posted cursor
	post := func(j int) {
		p := at(posted)
		pending[j%slots] = o.expectOperand(prev, scratch[(j%slots)*seg:][:p.len], p.off)[0]
		posted = advance(posted)
	}
	for j := range slots {
		post(j)
	}
	var cur cursor
	for j := range total {
		r := pending[j%slots]
		if err := o.await(r); err != nil {
			return err
		}
		p := at(cur)
		mine := p.of(buf)
		o.combine(mine, mine, r.buf)
		if j+slots < total {
			post(j + slots)
		}
		if cur.step < n-2 {
			if err := o.send(next, mine, p.off); err != nil {
				return err
			}
		}
		cur = advance(cur)
	}
	return nil
}

// ringAllGather spreads chunks[r] from every rank r to all: in step s
// rank r forwards chunk r-s (its own at step 0) and receives chunk r-s-1,
// straight into place, forwarding each segment as it lands. The caller
// must have flushed sends that read buf.
func (o *op) ringAllGather(buf []byte, chunks []span) error {
	n, me := o.c.size(), o.c.rank
	if n == 1 {
		return nil
	}
	next, prev := (me+1)%n, (me+n-1)%n
	chunk := func(i int) span { return chunks[((i%n)+n)%n] }

	// Step s's receives follow each other in o.recvs, o.segments of its
	// chunk's length of them.
	first := len(o.recvs)
	for s := range n - 1 {
		c := chunk(me - s - 1)
		o.expect(prev, c.of(buf), c.off)
	}
	own := chunk(me)
	if err := o.send(next, own.of(buf), own.off); err != nil {
		return err
	}
	for s := range n - 1 {
		k := o.segments(chunk(me - s - 1).len)
		for _, r := range o.recvs[first : first+k] {
			if err := o.await(r); err != nil {
				return err
			}
			if s < n-2 {
				if err := o.send(next, r.buf, int(r.want.offset)); err != nil {
					return err
				}
			}
		}
		first += k
	}
	return nil
}

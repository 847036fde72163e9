package collective

// The ring primitives shared by all_reduce, reduce, reduce_scatter and
// all_gather. Rank r sends to r+1 and receives from r-1; chunk c of the
// buffer (chunks[c], one per rank) ends on rank c.

// ringSlots is how many received segments the reduce-scatter keeps posted
// ahead, so the next ones land in place while it reduces the current one.
const ringSlots = 4

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

	// The segments we receive, in the order they come.
	type part struct {
		at   span
		step int
	}
	seg := o.segment()
	var plan []part
	for s := range n - 1 {
		c := chunk(me - s - 2)
		for lo := 0; ; lo += seg {
			plan = append(plan, part{span{c.off + lo, min(seg, c.len-lo)}, s})
			if lo+seg >= c.len {
				break
			}
		}
	}
	first := chunk(me - 1)
	if err := o.send(next, first.of(buf), first.off); err != nil {
		return err
	}

	slots := min(ringSlots, len(plan))
	scratch := o.scratch(slots * seg)
	pending := make([]*recvReq, len(plan))
	post := func(j int) {
		p := plan[j]
		slot := scratch[(j%slots)*seg:][:p.at.len]
		pending[j] = o.expect(prev, slot, p.at.off)[0]
	}
	for j := range slots {
		post(j)
	}
	for j, p := range plan {
		r := pending[j]
		if err := o.await(r); err != nil {
			return err
		}
		mine := p.at.of(buf)
		o.combine(mine, mine, r.buf)
		if j+slots < len(plan) {
			post(j + slots)
		}
		if p.step < n-2 {
			if err := o.send(next, mine, p.at.off); err != nil {
				return err
			}
		}
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

	steps := make([][]*recvReq, n-1)
	for s := range steps {
		c := chunk(me - s - 1)
		steps[s] = o.expect(prev, c.of(buf), c.off)
	}
	own := chunk(me)
	if err := o.send(next, own.of(buf), own.off); err != nil {
		return err
	}
	for s, incoming := range steps {
		for _, r := range incoming {
			if err := o.await(r); err != nil {
				return err
			}
			if s < n-2 {
				if err := o.send(next, r.buf, int(r.want.offset)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

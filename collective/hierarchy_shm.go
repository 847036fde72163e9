package collective

import "runtime"

// allGatherSpans copies span spans[r] of every host rank r's buf into the
// same span of every other rank's buf: the last phase of the 2D
// all_reduce, whose chunks may differ in length and be empty. Ranks that
// can read each other's memory copy straight from each other's buffers
// (one copy per byte instead of two); the others go through their slots.
func (o *op) allGatherSpans(buf []byte, spans []span) error {
	me := o.c.rank
	longest := 0
	for _, s := range spans {
		longest = max(longest, s.len)
	}
	if o.c.shm.cma && longest >= cmaMin && o.c.size() <= singleCopyMaxRanks {
		return o.allGatherSpansSingleCopy(buf, spans)
	}
	slot := o.c.shm.slot
	return o.runShared(func(s *shmWorld) error {
		for k := range roundsFor(longest, slot) {
			g := s.next()
			dst, err := o.claimSlot(g)
			if err != nil {
				return err
			}
			copyCached(dst, window(spans[me], k, slot).of(buf))
			o.signalWritten(g)
			err = o.eachWritten(g, func(peer int) error {
				w := window(spans[peer], k, slot)
				copyCached(w.of(buf), o.slotOf(peer, g)[:w.len])
				return nil
			})
			if err != nil {
				return err
			}
			o.signalConsumed(g)
		}
		return nil
	})
}

// allGatherSpansSingleCopy is allGatherSpans reading each peer's span
// from its buffer (readPeer); each rank waits until every peer has read
// its span before it returns.
func (o *op) allGatherSpansSingleCopy(buf []byte, spans []span) error {
	return o.runShared(func(s *shmWorld) error {
		g := s.next()
		if err := o.publish(g, buf); err != nil {
			return err
		}
		err := o.eachWritten(g, func(peer int) error {
			if spans[peer].len == 0 {
				return nil
			}
			return o.readFrom(peer, g, spans[peer], spans[peer].of(buf))
		})
		if err != nil {
			return err
		}
		err = o.consumeAll(g)
		runtime.KeepAlive(buf)
		return err
	})
}

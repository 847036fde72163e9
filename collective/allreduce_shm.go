package collective

// All-reduce through shared memory (shm.go), block by block. Block stamps
// count blocks across the world's calls; block g uses slot g%2 of every
// rank, which is free again once every peer has consumed block g-2.
//
// shm: each rank copies its block into its slot, reduces its 1/n chunk of
// the block reading every rank's slot, publishes the result in its own
// slot, and copies the other chunks' results out of the peers' slots:
// per rank, the block is copied in, reduced and copied out once.
//
// shm-flat: each rank copies its block into its slot and reduces the
// whole block reading every slot; one synchronisation instead of two,
// for small buffers whose cost is the synchronisation.
//
// Either way every element is reduced in rank order, ((x0 op x1) op x2)
// ..., from the same operands, so every rank ends with the same bits.

// sharedBlocks cuts buf into the slot-sized blocks, at least one so that
// empty calls still meet (and check each other's calls).
func (o *op) sharedBlocks(buf []byte, each func(block []byte) error) error {
	s := o.c.t.shm
	if !s.enter() {
		return ErrClosed
	}
	defer s.exit()
	clear(s.checked)
	s.checked[o.c.rank] = true
	for lo := 0; ; lo += s.slot {
		if err := each(buf[lo:min(lo+s.slot, len(buf))]); err != nil {
			return err
		}
		if lo+s.slot >= len(buf) {
			return nil
		}
	}
}

// fillSlot starts block g: it waits until every peer is done with the
// slot's previous block, copies block in, and says so.
func (o *op) fillSlot(g uint32, block []byte) ([]byte, error) {
	s := o.c.t.shm
	for peer, w := range o.c.world {
		if peer != o.c.rank {
			if err := o.awaitShared(peer, s.regions[w].consumed, g-2, false); err != nil {
				return nil, err
			}
		}
	}
	me := o.c.world[o.c.rank]
	slot := s.regions[me].slots[g%2][:len(block)]
	copy(slot, block)
	s.signal(me, s.regions[me].written, g)
	return slot, nil
}

// reduceSlots sets dst to the reduction, in rank order, of span at of
// every rank's slot for block g, waiting for each rank's input. The
// world has at least two ranks.
func (o *op) reduceSlots(g uint32, dst []byte, at span) error {
	s := o.c.t.shm
	var acc []byte // the first operand, until dst holds the partial result
	for peer, w := range o.c.world {
		if peer != o.c.rank {
			if err := o.awaitShared(peer, s.regions[w].written, g, true); err != nil {
				return err
			}
		}
		in := at.of(s.regions[w].slots[g%2])
		switch peer {
		case 0:
			acc = in
		case 1:
			o.combine(dst, acc, in)
		default:
			o.combine(dst, dst, in)
		}
	}
	return nil
}

func (o *op) allReduceShared(buf []byte) error {
	s := o.c.t.shm
	n, me, es := o.c.size(), o.c.rank, o.hdr.dtype.Size()
	self := o.c.world[me]
	return o.sharedBlocks(buf, func(block []byte) error {
		s.stamp++
		g := s.stamp
		slot, err := o.fillSlot(g, block)
		if err != nil {
			return err
		}
		chunks := evenSpans(len(block)/es, es, n)
		mine := chunks[me]
		if err := o.reduceSlots(g, mine.of(block), mine); err != nil {
			return err
		}
		copy(mine.of(slot), mine.of(block))
		s.signal(self, s.regions[self].reduced, g)
		for peer, w := range o.c.world {
			if peer == me {
				continue
			}
			if err := o.awaitShared(peer, s.regions[w].reduced, g, true); err != nil {
				return err
			}
			c := chunks[peer]
			copy(c.of(block), c.of(s.regions[w].slots[g%2]))
		}
		s.signal(self, s.regions[self].consumed, g)
		return nil
	})
}

func (o *op) allReduceSharedFlat(buf []byte) error {
	s := o.c.t.shm
	self := o.c.world[o.c.rank]
	return o.sharedBlocks(buf, func(block []byte) error {
		s.stamp++
		g := s.stamp
		if _, err := o.fillSlot(g, block); err != nil {
			return err
		}
		if err := o.reduceSlots(g, block, span{0, len(block)}); err != nil {
			return err
		}
		s.signal(self, s.regions[self].consumed, g)
		return nil
	})
}

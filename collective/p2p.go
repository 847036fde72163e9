package collective

import (
	"context"
	"fmt"
	"math"
)

// Send and Recv use a channel per tag, apart from the collectives', so
// messages on different tags, and collectives on other communicators,
// may be in flight at once. A message of any size goes in segments; its
// first frame says how many elements it holds, and a Recv whose buffer
// differs fails with ErrMismatch.

// Send delivers buf to peer's Recv on the same tag. It returns once the
// message is handed to the kernel.
func (c *comm) Send(ctx context.Context, buf []byte, dt DType, peer int, tag int) error {
	o, err := c.beginP2P(ctx, "send", buf, dt, peer, tag)
	if err != nil {
		return err
	}
	return o.finish(o.send(peer, buf, 0))
}

// Recv fills buf with the message from peer (or from whichever rank sends
// first, for AnySource) on tag, and returns the sender.
func (c *comm) Recv(ctx context.Context, buf []byte, dt DType, peer int, tag int) (int, error) {
	o, err := c.beginP2P(ctx, "recv", buf, dt, peer, tag)
	if err != nil {
		return -1, err
	}
	if peer != AnySource {
		return peer, o.finish(o.awaitAll(o.expect(peer, buf, 0)))
	}
	first := o.expectAny(buf)
	if err := o.await(first); err != nil {
		return -1, o.finish(err)
	}
	peer = c.commRank(first.from, -1)
	if rest := len(first.buf); rest < len(buf) {
		err = o.awaitAll(o.expect(peer, buf[rest:], rest))
	}
	return peer, o.finish(err)
}

// beginP2P checks a send or receive and starts its op, which has no
// sequence number: a tag's messages match in the order they are sent.
func (c *comm) beginP2P(ctx context.Context, what string, buf []byte, dt DType, peer, tag int) (*op, error) {
	if err := checkBuffer(what, buf, dt); err != nil {
		return nil, err
	}
	switch {
	case what == "recv" && peer == AnySource:
	case peer < 0 || peer >= c.size():
		return nil, fmt.Errorf("collective: %s: peer %d out of range for %d ranks", what, peer, c.size())
	case peer == c.rank:
		return nil, fmt.Errorf("collective: %s: rank %d cannot %s itself", what, peer, what)
	}
	if tag < math.MinInt32 || tag > math.MaxInt32 {
		return nil, fmt.Errorf("collective: %s: tag %d does not fit in 32 bits", what, tag)
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	select {
	case <-c.failed:
		return nil, c.failure()
	default:
	}
	o := &op{}
	o.reset(c, ctx, header{kind: kindData, coll: collSend, comm: c.id, dtype: dt, tag: int32(tag), count: uint64(len(buf) / dt.Size())})
	// A receive from a peer that is gone may still find its message
	// buffered (the transport's post fails it otherwise); a send cannot.
	if what == "send" {
		if err := c.t.peerGone(c.world[peer]); err != nil {
			return nil, o.finish(&PeerError{Rank: peer, Op: o.label(), Err: err})
		}
	}
	return o, nil
}

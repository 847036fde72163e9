package collective

import (
	"encoding/binary"
	"fmt"
)

// The wire format. Every frame is a fixed 56-byte header, little-endian,
// followed by length payload bytes:
//
//	 0 magic   u16  "gC"
//	 2 version u8
//	 3 kind    u8   hello, data, abort, query, status
//	 4 coll    u8   the collective (data frames)
//	 5 dtype   u8
//	 6 reduce  u8   the reduction operator
//	 7 algo    u8   the algorithm the sender runs
//	 8 comm    u64  communicator id (world or a Split of it)
//	16 seq     u64  the collective's sequence number in comm; in a
//	                hello, the sender's process id
//	24 count   u64  the collective's element count (see call)
//	32 offset  u64  where the payload goes in the receiver's buffer
//	40 root    i32  root rank; in a hello, the sender's world rank
//	44 tag     i32  send/recv tag; in a hello, the connection's lane
//	48 length  u32  payload bytes
//	52 spare   u32  zero
//
// A receiver knows exactly which header it expects next from each peer on
// each channel, so one comparison of the whole header both routes the
// payload and detects ranks that called different collectives.

const (
	headerSize   = 56
	frameMagic   = 0x4367 // "gC" little-endian
	frameVersion = 1

	// maxPayload bounds a frame's payload; senders split messages into
	// segments far smaller, so a larger length means garbage.
	maxPayload = 64 << 20
	// maxControlPayload bounds abort and status payloads.
	maxControlPayload = 64 << 10
)

type frameKind uint8

const (
	kindHello  frameKind = 1 // first frame of a connection: who dials
	kindData   frameKind = 2 // a collective's or a send's payload
	kindAbort  frameKind = 3 // the sender's communicator failed; JSON abortNote
	kindQuery  frameKind = 4 // "what are you waiting for?" after a timeout
	kindStatus frameKind = 5 // the answer to a query; JSON statusNote
)

// collKind names the operation a data frame belongs to.
type collKind uint8

const (
	collAllReduce collKind = iota + 1
	collBroadcast
	collReduce
	collAllGather
	collGather
	collScatter
	collReduceScatter
	collAllToAll
	collBarrier
	collSend
	collSplit
)

var collNames = [...]string{
	collAllReduce:     "all_reduce",
	collBroadcast:     "broadcast",
	collReduce:        "reduce",
	collAllGather:     "all_gather",
	collGather:        "gather",
	collScatter:       "scatter",
	collReduceScatter: "reduce_scatter",
	collAllToAll:      "all_to_all",
	collBarrier:       "barrier",
	collSend:          "send",
	collSplit:         "split",
}

func (c collKind) String() string {
	if int(c) < len(collNames) && collNames[c] != "" {
		return collNames[c]
	}
	return fmt.Sprintf("collective(%d)", uint8(c))
}

func (c collKind) reduces() bool {
	return c == collAllReduce || c == collReduce || c == collReduceScatter
}

func (c collKind) rooted() bool {
	return c == collBroadcast || c == collReduce || c == collGather || c == collScatter
}

// header is a decoded frame header.
type header struct {
	kind   frameKind
	coll   collKind
	dtype  DType
	reduce Op
	algo   algorithm
	comm   uint64
	seq    uint64
	count  uint64
	offset uint64
	root   int32
	tag    int32
	length uint32
}

func (h *header) encode(b *[headerSize]byte) {
	le := binary.LittleEndian
	le.PutUint16(b[0:], frameMagic)
	b[2] = frameVersion
	b[3] = byte(h.kind)
	b[4] = byte(h.coll)
	b[5] = byte(h.dtype)
	b[6] = byte(h.reduce)
	b[7] = byte(h.algo)
	le.PutUint64(b[8:], h.comm)
	le.PutUint64(b[16:], h.seq)
	le.PutUint64(b[24:], h.count)
	le.PutUint64(b[32:], h.offset)
	le.PutUint32(b[40:], uint32(h.root))
	le.PutUint32(b[44:], uint32(h.tag))
	le.PutUint32(b[48:], h.length)
	le.PutUint32(b[52:], 0)
}

// decode parses b, rejecting what our peers never send.
func (h *header) decode(b []byte) error {
	le := binary.LittleEndian
	if le.Uint16(b[0:]) != frameMagic || b[2] != frameVersion {
		return fmt.Errorf("collective: bad frame magic %#x version %d", le.Uint16(b[0:]), b[2])
	}
	*h = header{
		kind:   frameKind(b[3]),
		coll:   collKind(b[4]),
		dtype:  DType(b[5]),
		reduce: Op(b[6]),
		algo:   algorithm(b[7]),
		comm:   le.Uint64(b[8:]),
		seq:    le.Uint64(b[16:]),
		count:  le.Uint64(b[24:]),
		offset: le.Uint64(b[32:]),
		root:   int32(le.Uint32(b[40:])),
		tag:    int32(le.Uint32(b[44:])),
		length: le.Uint32(b[48:]),
	}
	limit := uint32(maxPayload)
	switch h.kind {
	case kindData:
	case kindHello:
		limit = 0
	case kindAbort, kindQuery, kindStatus:
		limit = maxControlPayload
	default:
		return fmt.Errorf("collective: unknown frame kind %d", h.kind)
	}
	if h.length > limit {
		return fmt.Errorf("collective: %d-byte payload in a kind %d frame", h.length, h.kind)
	}
	return nil
}

// call describes the collective a data frame belongs to, for errors.
func (h *header) call() Call {
	c := Call{
		Op:      h.coll.String(),
		DType:   h.dtype,
		Count:   h.count,
		Reduce:  h.reduce,
		Root:    int(h.root),
		Seq:     h.seq,
		Algo:    h.algo.String(),
		Tag:     int(h.tag),
		reduces: h.coll.reduces(),
		rooted:  h.coll.rooted(),
		tagged:  h.coll == collSend,
	}
	if c.tagged {
		c.Op = "send/recv"
	}
	return c
}

package rendezvous

import "encoding/binary"

// What the event loop does with the bytes one read brought from a parked
// connection (eventloop_linux.go). The decision is here, apart from the
// loop, so that it is the same on every system and tested by a table.
type batchPlan int

const (
	// planInline: whole requests only; the loop handles them and writes
	// their replies itself.
	planInline batchPlan = iota
	// planHandOff: a partial frame, an unknown or oversized one, or a read
	// that filled the loop's buffer (more may be waiting); the connection
	// goes to its goroutine with the bytes, which reads the rest there
	// and reports what is wrong as it always has.
	planHandOff
)

// planBatch decides for the bytes b read from a connection speaking d;
// filled says the read filled the loop's buffer. Every query is cheap to
// handle inline once whole: a WAIT that must wait registers a waiter and
// is answered later by the flusher, as on the goroutine path.
func planBatch(b []byte, filled bool, d Dialect, lim limits) batchPlan {
	if filled {
		return planHandOff
	}
	for len(b) > 0 {
		o, ok := d.op(b[0])
		if !ok {
			return planHandOff
		}
		s := frameScanner{b: b[1:], lim: lim, whole: true}
		req := request{op: o}
		req.visit(&s)
		if !s.whole {
			return planHandOff
		}
		b = s.b
	}
	return planInline
}

// detectDialectBytes tells a connection's dialect from its first bytes,
// as frameReader.detectDialect does, and how many of them the greeting
// takes (a torch >= 2.2 VALIDATE); ok is false when they are too few to
// tell.
func detectDialectBytes(b []byte) (d Dialect, skip int, ok bool) {
	switch {
	case len(b) == 0:
		return Dialect113, 0, false
	case b[0] != 0:
		return Dialect113, 0, true
	case len(b) < 5:
		return Dialect113, 0, false
	case binary.LittleEndian.Uint32(b[1:]) != validateMagic:
		return Dialect113, 0, true
	}
	return DialectV2, 5, true
}

// frameScanner walks a frame's fields in bytes already read, through the
// same layout (request.visit) that the frameReader decodes, without
// allocating: it only tells whether the frame is whole and within limits.
type frameScanner struct {
	b     []byte
	lim   limits
	whole bool // every field so far was there and within its limit
}

func (s *frameScanner) skip(n uint64) {
	if !s.whole || n > uint64(len(s.b)) {
		s.whole = false
		return
	}
	s.b = s.b[n:]
}

// length reads a u64 length or count, which must be at most max.
func (s *frameScanner) length(max uint64) uint64 {
	if !s.whole || len(s.b) < 8 {
		s.whole = false
		return 0
	}
	n := binary.LittleEndian.Uint64(s.b)
	s.b = s.b[8:]
	if n > max {
		s.whole = false
		return 0
	}
	return n
}

func (s *frameScanner) key(*string)    { s.skip(s.length(s.lim.maxKeyLen)) }
func (s *frameScanner) value(*[]byte)  { s.skip(s.length(s.lim.maxValueLen)) }
func (s *frameScanner) delta(*int64)   { s.skip(8) }
func (s *frameScanner) nonce(*uint32)  { s.skip(4) }
func (s *frameScanner) keys(*[]string) { s.each(s.key) }
func (s *frameScanner) pairs(*[]string, *[][]byte) {
	s.each(func(k *string) {
		s.key(k)
		s.value(nil)
	})
}

// each scans a count, then that many items with scan.
func (s *frameScanner) each(scan func(*string)) {
	n := s.length(s.lim.maxKeys)
	for i := uint64(0); i < n && s.whole; i++ {
		scan(nil)
	}
}

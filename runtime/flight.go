package runtime

import (
	"encoding/binary"
	"sync/atomic"
	"time"
	"unsafe"
)

// The flight recorder: after its counter, the progress file holds the
// worker's last flightSlots operations, so that the launcher can tell,
// when the group hangs, which operation each rank is in and which rank
// the others wait for. The layout, all in the host's byte order:
//
//	0   counter   uint64 (see ProgressFileEnv)
//	8   magic     uint32 flightMagic
//	12  slots     uint32 flightSlots
//	16  next      uint64 the sequence number of the last operation begun
//	64  slots of flightSlotSize bytes, operation seq in slot (seq-1)%slots:
//	    0  seq    uint64 (0: empty or being written)
//	    8  start  int64 Unix nanoseconds
//	    16 end    int64 Unix nanoseconds (0: running)
//	    24 count  int64 elements (0: not one tensor)
//	    32 peer   int64 src or dst of a message (-1: none)
//	    40 state  uint64 flightRunning, flightDone or flightFailed
//	    48 op     [24]byte name, NUL-padded
//	    72 dtype  [8]byte name, NUL-padded
//
// Recording costs two clock reads and a few atomic stores per operation,
// and allocates nothing. Sequence numbers count every operation the
// worker began, from 1, so ranks that call the same operations in the
// same order give each the same number.
const (
	flightMagic      = 0x67726631 // "grf1"
	flightSlots      = 64
	flightHeader     = 64
	flightSlotSize   = 80
	progressFileSize = flightHeader + flightSlots*flightSlotSize

	flightRunning = 1
	flightDone    = 2
	flightFailed  = 3
)

// opDesc is what the flight recorder notes of an operation besides its
// name: its tensor's element type and length, and its peer.
type opDesc struct {
	dtype    DType
	count    int
	peer     int
	hasDType bool
}

// describe is the opDesc of an operation on t.
func describe(t Tensor) opDesc {
	return opDesc{dtype: t.dtype, count: t.Len(), peer: -1, hasDType: true}
}

// describe is the opDesc of an operation on args: that of its first
// tensor.
func (args operands) describe() opDesc {
	for _, ts := range [][]*Tensor{args.reads, args.writes} {
		if len(ts) > 0 {
			return describe(*ts[0])
		}
	}
	return opDesc{peer: -1}
}

func (p *progress) word(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&p.mem[off]))
}

// initFlight stamps the recorder's header.
func (p *progress) initFlight() {
	binary.NativeEndian.PutUint32(p.mem[8:], flightMagic)
	binary.NativeEndian.PutUint32(p.mem[12:], flightSlots)
}

// begin records an operation's start and returns its sequence number; 0
// when nothing records.
func (p *progress) begin(op string, d opDesc) uint64 {
	if p == nil {
		return 0
	}
	seq := p.word(16).Add(1)
	base := flightHeader + int((seq-1)%flightSlots)*flightSlotSize
	p.word(base).Store(0) // a reader skips the slot while it changes
	p.word(base + 8).Store(uint64(time.Now().UnixNano()))
	p.word(base + 16).Store(0)
	p.word(base + 24).Store(uint64(d.count))
	p.word(base + 32).Store(uint64(int64(d.peer)))
	p.word(base + 40).Store(flightRunning)
	putName(p.mem[base+48:base+72], op)
	var dt string
	if d.hasDType {
		dt = d.dtype.String()
	}
	putName(p.mem[base+72:base+80], dt)
	p.word(base).Store(seq)
	return seq
}

// end records the end of operation seq, unless its slot has been taken
// by a later one.
func (p *progress) end(seq uint64, err error) {
	if p == nil || seq == 0 {
		return
	}
	base := flightHeader + int((seq-1)%flightSlots)*flightSlotSize
	if p.word(base).Load() != seq {
		return
	}
	state := uint64(flightDone)
	if err != nil {
		state = flightFailed
	}
	p.word(base + 16).Store(uint64(time.Now().UnixNano()))
	p.word(base + 40).Store(state)
}

func putName(dst []byte, name string) {
	n := copy(dst, name)
	clear(dst[n:])
}

package rendezvous

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// This file holds the TCPStore framing shared by the server and the client:
// the two numberings of the query types, one field layout per operation
// (request.visit) that drives both decoding and encoding, and the
// little-endian primitives. See the protocol notes in the design folder.

// Dialect selects the numbering of TCPStore query types on a connection.
type Dialect int

const (
	// DialectAuto makes a Client probe for a torch >= 2.2 server and fall
	// back to torch 1.13's dialect when the probe is refused.
	DialectAuto Dialect = iota
	// Dialect113 is torch 1.13's: no handshake, SET = 0, a WATCH_KEY query,
	// no APPEND, MULTI_*, CANCEL_WAIT or PING.
	Dialect113
	// DialectV2 is torch >= 2.2's: VALIDATE first, SET = 1, up to LIST = 17.
	DialectV2
)

func (d Dialect) String() string {
	switch d {
	case DialectAuto:
		return "auto"
	case Dialect113:
		return "torch-1.13"
	case DialectV2:
		return "torch-2"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// op is a query type independent of its dialect's number.
type op uint8

const (
	opValidate op = iota
	opSet
	opCompareSet
	opGet
	opAdd
	opCheck
	opWait
	opNumKeys
	opWatchKey
	opDelete
	opAppend
	opMultiGet
	opMultiSet
	opCancelWait
	opPing
	opQueuePush
	opQueuePop
	opQueueLen
	opList
)

var opNames = [...]string{
	opValidate:   "validate",
	opSet:        "set",
	opCompareSet: "compare_set",
	opGet:        "get",
	opAdd:        "add",
	opCheck:      "check",
	opWait:       "wait",
	opNumKeys:    "num_keys",
	opWatchKey:   "watch_key",
	opDelete:     "delete_key",
	opAppend:     "append",
	opMultiGet:   "multi_get",
	opMultiSet:   "multi_set",
	opCancelWait: "cancel_wait",
	opPing:       "ping",
	opQueuePush:  "queue_push",
	opQueuePop:   "queue_pop",
	opQueueLen:   "queue_len",
	opList:       "list",
}

func (o op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Each dialect's query types, indexed by their type byte.
var (
	ops113 = []op{opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opNumKeys, opWatchKey, opDelete}
	opsV2  = []op{
		opValidate, opSet, opCompareSet, opGet, opAdd, opCheck, opWait, opNumKeys, opDelete,
		opAppend, opMultiGet, opMultiSet, opCancelWait, opPing, opQueuePush, opQueuePop, opQueueLen, opList,
	}
)

func (d Dialect) ops() []op {
	if d == Dialect113 {
		return ops113
	}
	return opsV2
}

// op returns the operation that type byte code stands for in d.
func (d Dialect) op(code byte) (op, bool) {
	ops := d.ops()
	if int(code) >= len(ops) {
		return 0, false
	}
	return ops[code], true
}

// code returns o's type byte in d.
func (d Dialect) code(o op) (byte, bool) {
	for code, known := range d.ops() {
		if known == o {
			return byte(code), true
		}
	}
	return 0, false
}

// Reply codes, the same in every torch version.
const (
	checkReady    byte = 0
	checkNotReady byte = 1

	stopWaiting  byte = 0
	waitCanceled byte = 1

	// Kinds of 1.13 watch events, pushed on a WATCH_KEY connection.
	keyUpdated         byte = 0
	keyCreated         byte = 1
	keyDeleted         byte = 2
	keyWatchRegistered byte = 3
	keyAppended        byte = 4
)

// validateMagic opens every torch >= 2.2 connection: 00 CE F7 85 3C.
const validateMagic uint32 = 0x3C85F7CE

// request is one decoded query. Fields unused by its op stay zero.
type request struct {
	op       op
	key      string
	keys     []string // CHECK, WAIT, MULTI_GET, MULTI_SET
	value    []byte   // SET, APPEND, QUEUE_PUSH; COMPARE_SET's desired value
	expected []byte   // COMPARE_SET
	values   [][]byte // MULTI_SET, parallel to keys
	delta    int64    // ADD
	nonce    uint32   // VALIDATE's magic, PING's nonce
}

// fieldCodec reads or writes one field of a request; a frameReader fills
// the fields, a frameWriter sends them.
type fieldCodec interface {
	key(*string)
	value(*[]byte)
	keys(*[]string)
	pairs(*[]string, *[][]byte)
	delta(*int64)
	nonce(*uint32)
}

// visit walks req's fields in wire order: the one description of each
// query's layout.
func (req *request) visit(c fieldCodec) {
	switch req.op {
	case opSet, opAppend, opQueuePush:
		c.key(&req.key)
		c.value(&req.value)
	case opCompareSet:
		c.key(&req.key)
		c.value(&req.expected)
		c.value(&req.value)
	case opGet, opDelete, opWatchKey, opQueuePop, opQueueLen:
		c.key(&req.key)
	case opAdd:
		c.key(&req.key)
		c.delta(&req.delta)
	case opCheck, opWait, opMultiGet:
		c.keys(&req.keys)
	case opMultiSet:
		c.pairs(&req.keys, &req.values)
	case opValidate, opPing:
		c.nonce(&req.nonce)
	case opNumKeys, opCancelWait, opList:
	}
}

// limits bound what a frameReader accepts before it allocates anything.
type limits struct {
	maxKeyLen   uint64
	maxValueLen uint64
	maxKeys     uint64
}

// frameError is a malformed or oversized frame: the peer is not speaking
// the protocol, so its connection is closed.
type frameError struct {
	reason string
	err    error // the underlying read error, if any
}

func (e *frameError) Error() string {
	if e.err != nil {
		return "rendezvous: " + e.reason + ": " + e.err.Error()
	}
	return "rendezvous: " + e.reason
}

func (e *frameError) Unwrap() error { return e.err }

// frameReader decodes frames. Its first error sticks: later reads return
// zero values, so a sequence of reads is checked once, with takeErr.
type frameReader struct {
	r   *bufio.Reader
	lim limits
	err error

	// mem, if not nil, is charged for the keys and values of the request
	// being read before they are allocated; held is what it holds for it.
	mem  *budget
	held int64
}

// reserve charges n bytes about to be read, or fails the frame with
// ErrOverBudget.
func (f *frameReader) reserve(n int) {
	if f.mem == nil || f.err != nil {
		return
	}
	if !f.mem.reserve(int64(n), n > largeWrite) {
		f.fail(ErrOverBudget)
		return
	}
	f.held += int64(n)
}

// releaseHeld returns what the last request reserved, once its keys and
// values are stored (and charged) or dropped.
func (f *frameReader) releaseHeld() {
	if f.held != 0 {
		f.mem.release(f.held)
		f.held = 0
	}
}

// takeErr returns the sticky error and clears it for the next frame.
func (f *frameReader) takeErr() error {
	err := f.err
	f.err = nil
	return err
}

func (f *frameReader) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// detectDialect tells a torch 1.13 client from a torch >= 2.2 one by its
// first bytes (protocol §2). A v2 client opens with VALIDATE, 00 CE F7 85
// 3C, which is consumed. Any other first byte starts a 1.13 query, acted
// on without waiting for more: a 1.13 GETNUMKEYS is a lone byte expecting
// a reply. A 0x00 not followed by the magic is a 1.13 SET, those four
// bytes being the low half of its key length.
func (f *frameReader) detectDialect() (Dialect, error) {
	first, err := f.r.Peek(1)
	if err != nil {
		return Dialect113, err
	}
	if first[0] != 0 {
		return Dialect113, nil
	}
	head, err := f.r.Peek(5)
	if err != nil {
		return Dialect113, &frameError{reason: "truncated first frame", err: io.ErrUnexpectedEOF}
	}
	if binary.LittleEndian.Uint32(head[1:]) != validateMagic {
		return Dialect113, nil
	}
	_, _ = f.r.Discard(5)
	return DialectV2, nil
}

// readRequest decodes one query in dialect d. An error reading the type
// byte is the peer's (io.EOF: it hung up between requests); any later
// failure is a *frameError.
func (f *frameReader) readRequest(d Dialect) (request, error) {
	code, err := f.r.ReadByte()
	if err != nil {
		return request{}, err
	}
	o, ok := d.op(code)
	if !ok {
		return request{}, &frameError{reason: fmt.Sprintf("unknown %v query type %d", d, code)}
	}
	req := request{op: o}
	req.visit(f)
	if err := f.takeErr(); err != nil {
		if _, ok := err.(*frameError); !ok && !errors.Is(err, ErrOverBudget) {
			err = &frameError{reason: "truncated " + o.String() + " frame", err: err}
		}
		return request{}, err
	}
	return req, nil
}

// full reads exactly len(p) bytes; an EOF inside a frame is unexpected.
func (f *frameReader) full(p []byte) {
	if f.err != nil {
		return
	}
	if _, err := io.ReadFull(f.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		f.fail(err)
	}
}

func (f *frameReader) readU8() byte {
	var b [1]byte
	f.full(b[:])
	return b[0]
}

func (f *frameReader) readU32() uint32 {
	var b [4]byte
	f.full(b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (f *frameReader) readU64() uint64 {
	var b [8]byte
	f.full(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func (f *frameReader) readI64() int64 { return int64(f.readU64()) }

// readLen reads a u64 length or count and checks it against max before
// anyone allocates for it.
func (f *frameReader) readLen(what string, max uint64) int {
	n := f.readU64()
	if f.err == nil && n > max {
		f.fail(&frameError{reason: fmt.Sprintf("%s %d over the limit %d", what, n, max)})
	}
	if f.err != nil {
		return 0
	}
	return int(n)
}

func (f *frameReader) readKey() string {
	n := f.readLen("key length", f.lim.maxKeyLen)
	f.reserve(n + keyHeaderCost)
	if f.err != nil || n == 0 {
		return ""
	}
	if n <= f.r.Size() {
		// Convert straight from the read buffer: one allocation per key.
		b, err := f.r.Peek(n)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			f.fail(err)
			return ""
		}
		s := string(b)
		_, _ = f.r.Discard(n)
		return s
	}
	return string(f.readN(n))
}

func (f *frameReader) readValue() []byte {
	n := f.readLen("value length", f.lim.maxValueLen)
	f.reserve(n)
	if f.err != nil {
		return nil
	}
	return f.readN(n)
}

// readChunk is the most a frameReader allocates ahead of the bytes that
// fill it, however large a length the peer announced.
const readChunk = 16 << 10

// readN reads n bytes into a buffer that grows as they arrive, so that a
// peer announcing a large value must send it before we hold its memory.
func (f *frameReader) readN(n int) []byte {
	buf := make([]byte, min(n, readChunk))
	for filled := 0; f.err == nil; {
		f.full(buf[filled:])
		filled = len(buf)
		if filled == n {
			return buf
		}
		grown := make([]byte, min(n, 2*filled))
		copy(grown, buf)
		buf = grown
	}
	return nil
}

// fieldCodec, decoding.

func (f *frameReader) key(s *string)     { *s = f.readKey() }
func (f *frameReader) value(b *[]byte)   { *b = f.readValue() }
func (f *frameReader) delta(d *int64)    { *d = f.readI64() }
func (f *frameReader) nonce(n *uint32)   { *n = f.readU32() }
func (f *frameReader) keys(ks *[]string) { *ks = f.readKeys(nil) }

func (f *frameReader) pairs(ks *[]string, vs *[][]byte) {
	var values [][]byte
	*ks = f.readKeys(func() { values = append(values, f.readValue()) })
	*vs = values
}

// readKeys reads a count and that many keys, calling after (if not nil)
// behind each key to read the fields that follow it.
func (f *frameReader) readKeys(after func()) []string {
	n := f.readLen("key count", f.lim.maxKeys)
	keys := make([]string, 0, min(n, 16))
	for i := 0; i < n && f.err == nil; i++ {
		keys = append(keys, f.readKey())
		if after != nil {
			after()
		}
	}
	return keys
}

// frameWriter encodes frames into a bufio.Writer, whose error sticks until
// the next Flush reports it.
type frameWriter struct {
	w *bufio.Writer
}

func (f *frameWriter) putU8(b byte) { _ = f.w.WriteByte(b) }

func (f *frameWriter) putU32(v uint32) {
	_, _ = f.w.Write(binary.LittleEndian.AppendUint32(f.w.AvailableBuffer(), v))
}

func (f *frameWriter) putU64(v uint64) {
	_, _ = f.w.Write(binary.LittleEndian.AppendUint64(f.w.AvailableBuffer(), v))
}

func (f *frameWriter) putI64(v int64) { f.putU64(uint64(v)) }

func (f *frameWriter) putString(s string) {
	f.putU64(uint64(len(s)))
	_, _ = f.w.WriteString(s)
}

func (f *frameWriter) putBytes(b []byte) {
	f.putU64(uint64(len(b)))
	_, _ = f.w.Write(b)
}

// writeRequest encodes req in dialect d.
func (f *frameWriter) writeRequest(d Dialect, req *request) error {
	code, ok := d.code(req.op)
	if !ok {
		return fmt.Errorf("rendezvous: %v has no %v query", d, req.op)
	}
	f.putU8(code)
	req.visit(f)
	return nil
}

// fieldCodec, encoding.

func (f *frameWriter) key(s *string)   { f.putString(*s) }
func (f *frameWriter) value(b *[]byte) { f.putBytes(*b) }
func (f *frameWriter) delta(d *int64)  { f.putI64(*d) }
func (f *frameWriter) nonce(n *uint32) { f.putU32(*n) }

func (f *frameWriter) keys(ks *[]string) {
	f.putU64(uint64(len(*ks)))
	for _, k := range *ks {
		f.putString(k)
	}
}

func (f *frameWriter) pairs(ks *[]string, vs *[][]byte) {
	f.putI64(int64(len(*ks))) // torch's client writes MULTI_SET's count as int64
	for i, k := range *ks {
		f.putString(k)
		f.putBytes((*vs)[i])
	}
}

// flushingReader flushes pending output before each read from the
// network. Replies to a batch of pipelined requests thus leave in one
// write, and no reply is ever held back while its sender waits for input.
type flushingReader struct {
	flush func() error
	r     io.Reader
}

func (f flushingReader) Read(p []byte) (int, error) {
	if err := f.flush(); err != nil {
		return 0, err
	}
	return f.r.Read(p)
}

package rendezvous

import (
	"bufio"
	"bytes"
	"math"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// FuzzDecode feeds arbitrary bytes to the server: first to its frame
// decoder alone, bounding what decoding allocates by the input's size
// whatever lengths the input announces; then to a whole connection
// handler, which must not panic; then a good client must still be served.
func FuzzDecode(f *testing.F) {
	for _, seed := range [][]byte{
		add113("init/", 1),
		cat(set113("/k", "v"), wait113("/k"), get113("/k"), numKeys113()),
		cat(cs113("/cs", "", "x"), check113("/cs", "/no"), delete113("/cs")),
		cat(watch113("/w"), set113("/w", "1"), delete113("/w")),
		cat(v2Hello, pingV2(7), setV2("/k", "v"), appendV2("/k", "w"), multiGetV2("/k")),
		cat(v2Hello, waitV2("/x"), cancelWaitV2(), multiSetV2("/a", "1", "/x", "2")),
		cat(v2Hello, queuePushV2("/q", "j"), queueLenV2("/q"), queuePopV2("/q"), listV2()),
		cat(v2Hello, setV2("/p", "P"), addV2("/p", 1)),
		cat(u8(0), u64(math.MaxUint64)),
		cat(v2Hello, u8(11), i64(-1)),
		cat(v2Hello, u8(1), str("/k"), u64(1<<40), []byte("abc")),
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{0},
		{},
	} {
		f.Add(seed)
	}
	lim := limits{maxKeyLen: 1 << 10, maxValueLen: 1 << 20, maxKeys: 1 << 10}
	f.Fuzz(func(t *testing.T, data []byte) {
		allocated := allocatedBy(func() { decodeAll(data, lim) })
		// Per frame header: a key slice of at most 16 entries or the first
		// value chunk; per connection: the read buffer.
		if bound := uint64(1<<20 + 64*len(data)); allocated > bound {
			t.Fatalf("decoding %d bytes allocated %d bytes (bound %d)", len(data), allocated, bound)
		}

		srv := NewServer(ServerOptions{MaxKeyLen: 1 << 10, MaxValueLen: 1 << 20, MaxKeysPerRequest: 1 << 10})
		serveBytes(srv, data)
		good := cat(v2Hello, setV2("/fuzz-ok", "yes"), waitV2("/fuzz-ok"), getV2("/fuzz-ok"))
		if got, want := serveBytes(srv, good), cat(u8(stopWaiting), str("yes")); !bytes.Equal(got, want) {
			t.Fatalf("a good client after the fuzz input got % x, want % x", got, want)
		}
	})
}

// decodeAll decodes requests from data until the first error.
func decodeAll(data []byte, lim limits) {
	r := frameReader{r: bufio.NewReaderSize(bytes.NewReader(data), connBufferSize), lim: lim}
	d, err := r.detectDialect()
	for err == nil {
		_, err = r.readRequest(d)
	}
}

func allocatedBy(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// serveBytes runs one server connection on data and returns its replies,
// once the connection and its goroutines have ended.
func serveBytes(srv *Server, data []byte) []byte {
	nc := &bytesConn{in: bytes.NewReader(data)}
	srv.wg.Add(1) // serve's, as Server.startConn counts it
	newConn(srv, nc).serve()
	srv.wg.Wait()
	return nc.out.Bytes()
}

// bytesConn is a net.Conn reading a fixed input and recording the output
// of the connection's several writers.
type bytesConn struct {
	in  *bytes.Reader
	mu  sync.Mutex
	out bytes.Buffer
}

func (c *bytesConn) Read(p []byte) (int, error) { return c.in.Read(p) }

func (c *bytesConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) LocalAddr() net.Addr              { return fuzzAddr{} }
func (c *bytesConn) RemoteAddr() net.Addr             { return fuzzAddr{} }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }

type fuzzAddr struct{}

func (fuzzAddr) Network() string { return "fuzz" }
func (fuzzAddr) String() string  { return "fuzz" }

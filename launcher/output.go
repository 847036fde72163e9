package launcher

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// output is one worker stream: the parent's read end and where it goes.
type output struct {
	name  string // "stdout" or "stderr", for logs
	src   *os.File
	dst   io.Writer
	state *streamState
}

// streamState is what the output's copier tells the worker's drain.
type streamState struct {
	read atomic.Int64 // bytes read so far
	// idleSince is when the copier found the stream empty and began to
	// wait for more (nanoseconds on drainClock), 0 while it has data.
	idleSince atomic.Int64
	closed    atomic.Bool // by closeSources
}

// drainClock is the monotonic clock of streamState.idleSince.
var drainClock = time.Now()

func sinceDrainClock() int64 { return int64(time.Since(drainClock)) | 1 } // never 0

// copyBuffers lends the copiers their buffers only while they have data:
// 256 workers' streams waiting for output hold none (32 KiB each before).
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copy moves the stream to its destination until EOF. A terminal master
// reads EIO once the worker's side is closed, and finishOutput may close src
// to stop waiting; both end the stream normally. A failing destination stops
// receiving, but the stream is still drained so the worker never blocks on a
// full pipe.
func (o output) copy(log zerolog.Logger) {
	dst := &stickyWriter{w: o.dst}
	err := o.each(func(p []byte) { dst.Write(p) })
	if err != nil && !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) && !o.closed() {
		log.Warn().Err(err).Str("stream", o.name).Msg("reading worker output")
	}
	if dst.err != nil {
		log.Warn().Err(dst.err).Str("stream", o.name).Msg("worker output lost")
	}
}

// each calls use with every piece read from the stream until EOF (nil)
// or an error. The buffer is taken from copyBuffers once the stream has
// data and handed back after use.
func (o output) each(use func([]byte)) error {
	raw, err := o.src.SyscallConn()
	if err != nil {
		return err
	}
	for {
		var buf *[]byte
		var n int
		var readErr error
		err := raw.Read(func(fd uintptr) bool {
			b := copyBuffers.Get().(*[]byte)
			n, readErr = ignoringEINTR(func() (int, error) { return syscall.Read(int(fd), *b) })
			if errors.Is(readErr, syscall.EAGAIN) {
				copyBuffers.Put(b)
				o.state.idleSince.CompareAndSwap(0, sinceDrainClock())
				return false
			}
			buf = b
			return true
		})
		o.state.idleSince.Store(0)
		if n > 0 {
			o.state.read.Add(int64(n))
			use((*buf)[:n])
		}
		if buf != nil {
			copyBuffers.Put(buf)
		}
		switch {
		case err != nil:
			return err
		case readErr != nil:
			return readErr
		case n <= 0:
			return nil
		}
	}
}

func ignoringEINTR(read func() (int, error)) (int, error) {
	for {
		n, err := read()
		if !errors.Is(err, syscall.EINTR) {
			return n, err
		}
	}
}

// closed reports whether finishOutput closed the stream: the copier's
// error then means only that.
func (o output) closed() bool { return o.state.closed.Load() }

// stickyWriter forwards to w until the first error, then discards, and never
// reports an error, so that copying goes on draining the source.
type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err == nil {
		_, s.err = s.w.Write(p)
	}
	return len(p), nil
}

// streams collects the file descriptors of one worker being started.
type streams struct {
	childEnds []*os.File // the parent's copies of the worker's ends, closed once it started
	outputs   []output
}

// pipe returns the worker's end of a new pipe whose bytes go to dst, or nil
// (exec's /dev/null) when they would be discarded anyway.
func (s *streams) pipe(name string, dst io.Writer) (io.Writer, error) {
	if dst == nil || dst == io.Discard {
		return nil, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	s.add(w, output{name: name, src: r, dst: dst, state: new(streamState)})
	return w, nil
}

// terminal returns the worker's end of a new pseudo-terminal whose bytes go
// to dst. Even when they are discarded the terminal is read: a full terminal
// buffer would block the worker.
func (s *streams) terminal(name string, dst io.Writer) (io.Writer, error) {
	master, tty, err := openTerminal()
	if err != nil {
		return nil, err
	}
	if dst == nil {
		dst = io.Discard
	}
	s.add(tty, output{name: name, src: master, dst: dst, state: new(streamState)})
	return tty, nil
}

func (s *streams) add(childEnd *os.File, out output) {
	s.childEnds = append(s.childEnds, childEnd)
	s.outputs = append(s.outputs, out)
}

// closeChildEnds closes the parent's copies of the worker's ends, so that the
// read ends see EOF when the worker (and whatever inherited them) is gone.
func (s *streams) closeChildEnds() {
	for _, f := range s.childEnds {
		f.Close()
	}
}

// closeSources closes the parent's read ends, which ends their copies.
func closeSources(outputs []output) {
	for _, out := range outputs {
		out.close()
	}
}

func (o output) close() {
	o.state.closed.Store(true)
	o.src.Close()
}

// held is how many bytes wait in the stream, 0 when that is unknown.
func (o output) held() int64 {
	raw, err := o.src.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	// TIOCINQ is FIONREAD, for pipes as for terminals.
	raw.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	return int64(n)
}

// backlog is how many bytes the copier will have read once it has read
// what the stream holds now: read after held, so that a read between
// the two makes it too large rather than too small.
func (o output) backlog() int64 {
	held := o.held()
	return held + o.state.read.Load()
}

// lingering decides whether a process outside a dead worker's group holds
// one of its streams open (nanoseconds on drainClock): the copier has read
// what the stream held at the death (backlog) and bound has passed since;
// or, since the death, it has waited for bound on the stream, which is
// still empty (held): a copier woken late has data waiting. Time spent
// handing output on to a slow console counts for neither, so nothing the
// worker wrote is lost to it.
func lingering(now, died, idleSince, read, backlog, held int64, bound time.Duration) bool {
	if read >= backlog && now-died >= int64(bound) {
		return true
	}
	return idleSince != 0 && held == 0 && now-max(idleSince, died) >= int64(bound)
}

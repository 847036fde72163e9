package launcher

import (
	"errors"
	"io"
	"os"
	"syscall"

	"github.com/rs/zerolog"
)

// output is one worker stream: the parent's read end and where it goes.
type output struct {
	name string // "stdout" or "stderr", for logs
	src  *os.File
	dst  io.Writer
}

// copy moves the stream to its destination until EOF. A terminal master
// reads EIO once the worker's side is closed, and finishOutput may close src
// to stop waiting; both end the stream normally. A failing destination stops
// receiving, but the stream is still drained so the worker never blocks on a
// full pipe.
func (o output) copy(log zerolog.Logger) {
	dst := &stickyWriter{w: o.dst}
	_, err := io.Copy(dst, o.src)
	if err != nil && !errors.Is(err, syscall.EIO) && !errors.Is(err, os.ErrClosed) {
		log.Warn().Err(err).Str("stream", o.name).Msg("reading worker output")
	}
	if dst.err != nil {
		log.Warn().Err(dst.err).Str("stream", o.name).Msg("worker output lost")
	}
}

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
	s.add(w, output{name: name, src: r, dst: dst})
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
	s.add(tty, output{name: name, src: master, dst: dst})
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

// closeSources closes the parent's read ends; a pending Read returns
// os.ErrClosed.
func closeSources(outputs []output) {
	for _, out := range outputs {
		out.src.Close()
	}
}

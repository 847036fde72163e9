package launcher

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// DefaultPrefixTemplate is the line prefix gorun puts on worker output.
const DefaultPrefixTemplate = "[rank${rank}]: "

// MaxLineLength bounds what a console writer buffers: a longer line is cut
// into pieces of at most this many bytes, each printed as a line of its own.
const MaxLineLength = 64 << 10

// timestampLayout is RFC 3339 with milliseconds, fixed width so that the
// prefixes after it line up.
const timestampLayout = "2006-01-02T15:04:05.000Z07:00"

var errWriterClosed = errors.New("launcher: console writer closed")

// FormatPrefix expands torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
// variables ${role_name}, ${local_rank}, ${rank} and ${hostname}, plus
// ${host}, gorun's older name for the host. Anything else, including
// unknown variables, is kept as written (torchrun's safe_substitute does
// the same).
func FormatPrefix(template string, role string, rank, localRank int, host string) string {
	return strings.NewReplacer(
		"${role_name}", role,
		"${local_rank}", strconv.Itoa(localRank),
		"${rank}", strconv.Itoa(rank),
		"${hostname}", host,
		"${host}", host,
	).Replace(template)
}

// ParseLineFilters reads torchrun's --duplicate-*-filters: strings
// separated by commas, ",," standing for a comma; empty ones are dropped.
func ParseLineFilters(s string) []string {
	var filters []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] != ',':
			cur.WriteByte(s[i])
		case i+1 < len(s) && s[i+1] == ',':
			cur.WriteByte(',')
			i++
		default:
			if cur.Len() > 0 {
				filters = append(filters, cur.String())
			}
			cur.Reset()
		}
	}
	if cur.Len() > 0 {
		filters = append(filters, cur.String())
	}
	return filters
}

// ConsoleOptions configures a Console.
type ConsoleOptions struct {
	Timestamps bool             // start every line with the time it was written
	Now        func() time.Time // clock for Timestamps (nil = time.Now)
	// Keep, when set, prints only the lines it returns true for.
	Keep func(line []byte) bool
}

// Console multiplexes many workers' output into one writer, whole lines at a
// time, so that lines from different workers never interleave.
//
// Writers cut and prefix their lines on their own and meet only to queue
// them; whoever finds no write to out in progress writes everything queued
// so far in one call (a group commit), so that a node of 256 workers
// printing at once costs one write to out per round, not one per worker.
// A Write returns once its lines are out, as a direct write would.
type Console struct {
	out  io.Writer
	now  func() time.Time // nil when lines carry no timestamp
	keep func(line []byte) bool

	mu       sync.Mutex
	flushed  *sync.Cond // signalled on mu after every write to out
	queue    []byte     // whole lines waiting for out
	spare    []byte     // the last batch's buffer, for the next queue
	writing  bool       // a writer is writing a batch to out
	queued   uint64     // bytes ever queued
	written  uint64     // bytes ever handed to out, queued before
	writeErr error      // the first failed write to out: later writes fail too
}

// NewConsole returns a Console writing to out.
func NewConsole(out io.Writer, opts ConsoleOptions) *Console {
	c := &Console{out: out, keep: opts.Keep}
	c.flushed = sync.NewCond(&c.mu)
	if opts.Timestamps {
		c.now = opts.Now
		if c.now == nil {
			c.now = time.Now
		}
	}
	return c
}

// Writer returns a writer for one stream: it cuts the bytes written to it
// into lines and prints each whole line as prefix+line+"\n" (line+"\n"
// when the line starts with prefix already). "\r\n" endings
// become "\n". Close prints a pending partial line. It is safe to use from
// several goroutines.
func (c *Console) Writer(prefix string) io.WriteCloser {
	return &lineWriter{console: c, prefix: prefix}
}

// print queues lines, whole lines only, and returns once they have been
// written to out, writing them itself, with whatever else is queued, when
// no one else is writing.
func (c *Console) print(lines []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.writeErr != nil {
		return c.writeErr
	}
	c.queue = append(c.queue, lines...)
	c.queued += uint64(len(lines))
	mine := c.queued
	for c.written < mine && c.writeErr == nil {
		if c.writing {
			c.flushed.Wait()
			continue
		}
		batch := c.queue
		c.queue, c.writing = c.spare[:0], true
		c.mu.Unlock()
		_, err := c.out.Write(batch)
		c.mu.Lock()
		c.spare, c.writing = batch, false
		c.written += uint64(len(batch))
		if err != nil && c.writeErr == nil {
			c.writeErr = err
		}
		c.flushed.Broadcast()
	}
	if c.written < mine {
		return c.writeErr
	}
	return nil
}

type lineWriter struct {
	console *Console
	prefix  string

	mu      sync.Mutex // keeps one stream's lines in order; guards the rest
	partial []byte     // the unfinished last line
	lines   []byte     // this write's lines, cut and prefixed, reused
	closed  bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, errWriterClosed
	}
	stamp := w.console.stamp()
	out := w.lines[:0]
	data := p
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := data[:i]
		if len(w.partial) > 0 {
			line = append(w.partial, line...)
			w.partial = line[:0]
		}
		out = w.emitLine(out, stamp, line)
		data = data[i+1:]
	}
	out, w.partial = w.emitLong(out, stamp, append(w.partial, data...))
	w.lines = out
	if len(out) > 0 {
		if err := w.console.print(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close prints the partial last line, if any. Later writes fail.
func (w *lineWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if len(w.partial) == 0 {
		return nil
	}
	out := w.emitLine(nil, w.console.stamp(), w.partial)
	w.partial, w.lines = nil, nil
	if len(out) == 0 {
		return nil
	}
	return w.console.print(out)
}

// emitLine appends one complete line, without a trailing "\r", to out.
func (w *lineWriter) emitLine(out []byte, stamp string, line []byte) []byte {
	out, rest := w.emitLong(out, stamp, bytes.TrimSuffix(line, []byte("\r")))
	return w.emit(out, stamp, rest)
}

// emitLong appends leading pieces of line to out while it is longer than
// MaxLineLength and returns the rest.
func (w *lineWriter) emitLong(out []byte, stamp string, line []byte) ([]byte, []byte) {
	for len(line) > MaxLineLength {
		n := runeBoundary(line, MaxLineLength)
		out = w.emit(out, stamp, line[:n])
		line = line[n:]
	}
	return out, line
}

// emit appends one line with its prefix, unless the line already starts
// with it: torch 2.x workers prefix their own tracebacks "[rank1]: ", and
// gorun's default prefix would say it twice.
func (w *lineWriter) emit(out []byte, stamp string, line []byte) []byte {
	if w.console.keep != nil && !w.console.keep(line) {
		return out
	}
	out = append(out, stamp...)
	if !bytes.HasPrefix(line, []byte(w.prefix)) {
		out = append(out, w.prefix...)
	}
	out = append(out, line...)
	return append(out, '\n')
}

// stamp is the timestamp that starts every line of one write, or "".
func (c *Console) stamp() string {
	if c.now == nil {
		return ""
	}
	return c.now().Format(timestampLayout) + " "
}

// runeBoundary returns the largest cut ≤ limit that does not split a UTF-8
// sequence of b (or limit when b is not UTF-8 there); len(b) > limit.
func runeBoundary(b []byte, limit int) int {
	for cut := limit; cut > limit-utf8.UTFMax && cut > 0; cut-- {
		if utf8.RuneStart(b[cut]) {
			return cut
		}
	}
	return limit
}

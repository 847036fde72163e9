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
type Console struct {
	mu   sync.Mutex // serialises every write to out, and each writer's buffer
	out  io.Writer
	now  func() time.Time // nil when lines carry no timestamp
	keep func(line []byte) bool
}

// NewConsole returns a Console writing to out.
func NewConsole(out io.Writer, opts ConsoleOptions) *Console {
	c := &Console{out: out, keep: opts.Keep}
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

type lineWriter struct {
	console *Console
	prefix  string
	partial []byte // the unfinished last line, guarded by console.mu
	closed  bool   // guarded by console.mu
}

func (w *lineWriter) Write(p []byte) (int, error) {
	c := w.console
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.closed {
		return 0, errWriterClosed
	}
	var out bytes.Buffer
	stamp := c.stamp()
	data := p
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		line := append(w.partial, data[:i]...)
		w.emitLine(&out, stamp, line)
		w.partial, data = line[:0], data[i+1:]
	}
	w.partial = w.emitLong(&out, stamp, append(w.partial, data...))
	if out.Len() > 0 {
		if _, err := c.out.Write(out.Bytes()); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Close prints the partial last line, if any. Later writes fail.
func (w *lineWriter) Close() error {
	c := w.console
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if len(w.partial) == 0 {
		return nil
	}
	var out bytes.Buffer
	w.emitLine(&out, c.stamp(), w.partial)
	w.partial = nil
	_, err := c.out.Write(out.Bytes())
	return err
}

// emitLine prints one complete line, without a trailing "\r".
func (w *lineWriter) emitLine(out *bytes.Buffer, stamp string, line []byte) {
	w.emit(out, stamp, w.emitLong(out, stamp, bytes.TrimSuffix(line, []byte("\r"))))
}

// emitLong prints leading pieces of line while it is longer than
// MaxLineLength and returns the rest.
func (w *lineWriter) emitLong(out *bytes.Buffer, stamp string, line []byte) []byte {
	for len(line) > MaxLineLength {
		n := runeBoundary(line, MaxLineLength)
		w.emit(out, stamp, line[:n])
		line = line[n:]
	}
	return line
}

// emit prints one line with its prefix, unless the line already starts
// with it: torch 2.x workers prefix their own tracebacks "[rank1]: ", and
// gorun's default prefix would say it twice.
func (w *lineWriter) emit(out *bytes.Buffer, stamp string, line []byte) {
	if w.console.keep != nil && !w.console.keep(line) {
		return
	}
	out.WriteString(stamp)
	if !bytes.HasPrefix(line, []byte(w.prefix)) {
		out.WriteString(w.prefix)
	}
	out.Write(line)
	out.WriteByte('\n')
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

package launcher

import (
	"bytes"
	"io"
	"sync"
)

// ReportWidth is the width of the rules that frame a failure report
// (elastic.WriteReport): a line of ReportWidth '=' opens and closes one.
const ReportWidth = 60

// reportRule is the line that opens and closes a failure report.
var reportRule = bytes.Repeat([]byte("="), ReportWidth)

// maxReportBlock bounds how much of a report is held back: a longer block
// is passed through as it comes.
const maxReportBlock = 1 << 20

// reportsSeen is the set of failure reports the head has printed.
type reportsSeen struct {
	mu   sync.Mutex
	seen map[string]bool
}

// first reports whether report is new, and records it.
func (r *reportsSeen) first(report []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = make(map[string]bool)
	}
	if r.seen[string(report)] {
		return false
	}
	r.seen[string(report)] = true
	return true
}

// reportFilter passes one remote agent's stderr through, except a failure
// report that another host's agent printed already: every agent of a c10d
// job prints the same job-wide report, and the head shows it once. A
// report is held back from its opening rule to its closing one; whatever
// cannot be a whole report (too long, or cut off by Close) passes as is.
type reportFilter struct {
	w     io.WriteCloser
	seen  *reportsSeen
	lines lineBuffer
	// cut is set once the start of the last line was handed on: it is
	// too long to be a rule.
	cut   bool
	block []byte // the report being collected; nil outside one
}

// lineBuffer gathers a stream written in pieces into whole lines, holding
// the unfinished last one, of which it keeps no more than MaxLineLength
// bytes, as the console's lineWriter does.
type lineBuffer struct{ partial []byte }

// feed appends p and hands each whole line to line, in order, then the
// start of an unfinished line that grew past MaxLineLength (whole false).
// The slices are the buffer's own, valid only during the call.
func (b *lineBuffer) feed(p []byte, line func(l []byte, whole bool)) {
	b.partial = append(b.partial, p...)
	rest := b.partial
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line(rest[:i+1], true)
		rest = rest[i+1:]
	}
	if len(rest) > MaxLineLength {
		line(rest, false)
		rest = nil
	}
	// Keep the unfinished line at the start of the buffer, which later
	// appends then reuse.
	b.partial = b.partial[:copy(b.partial, rest)]
}

// take returns the unfinished line held, and forgets it.
func (b *lineBuffer) take() []byte {
	held := b.partial
	b.partial = nil
	return held
}

// Write hands on what passes of p in one write to f.w.
func (f *reportFilter) Write(p []byte) (int, error) {
	var out []byte
	f.lines.feed(p, func(l []byte, whole bool) {
		out = f.line(out, l)
		f.cut = !whole
	})
	if len(out) > 0 {
		if _, err := f.w.Write(out); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// line takes one line, or the start of a long one, and returns out with
// whatever of it, and of the report it closes, passes.
func (f *reportFilter) line(out, line []byte) []byte {
	rule := !f.cut && bytes.Equal(bytes.TrimRight(line, "\r\n"), reportRule)
	f.cut = false
	switch {
	case f.block == nil && !rule:
		return append(out, line...)
	case f.block == nil:
		f.block = append([]byte(nil), line...)
		return out
	}
	f.block = append(f.block, line...)
	switch {
	case rule:
		block := f.block
		f.block = nil
		if f.seen.first(block) {
			out = append(out, block...)
		}
	case len(f.block) > maxReportBlock:
		out = append(out, f.block...)
		f.block = nil
	}
	return out
}

// Close passes on what is held back, then closes the destination.
func (f *reportFilter) Close() error {
	f.w.Write(append(f.block, f.lines.take()...))
	f.block = nil
	return f.w.Close()
}

package launcher

import (
	"bytes"
	"io"
	"sync"
)

// reportRule is the line of '=' that opens and closes a failure report
// (elastic.WriteReport).
var reportRule = bytes.Repeat([]byte("="), 60)

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
	w       io.WriteCloser
	seen    *reportsSeen
	partial []byte // the last line, until its newline comes
	block   []byte // the report being collected; nil outside one
}

func (f *reportFilter) Write(p []byte) (int, error) {
	f.partial = append(f.partial, p...)
	for {
		i := bytes.IndexByte(f.partial, '\n')
		if i < 0 {
			break
		}
		line := f.partial[:i+1]
		if err := f.line(line); err != nil {
			return 0, err
		}
		f.partial = f.partial[i+1:]
	}
	// Keep the unfinished line in a buffer of its own, so appends do not
	// grow the consumed prefix forever.
	f.partial = append([]byte(nil), f.partial...)
	return len(p), nil
}

func (f *reportFilter) line(line []byte) error {
	rule := bytes.Equal(bytes.TrimRight(line, "\r\n"), reportRule)
	switch {
	case f.block == nil && !rule:
		_, err := f.w.Write(line)
		return err
	case f.block == nil:
		f.block = append([]byte(nil), line...)
		return nil
	}
	f.block = append(f.block, line...)
	if rule {
		block := f.block
		f.block = nil
		if f.seen.first(block) {
			_, err := f.w.Write(block)
			return err
		}
		return nil
	}
	if len(f.block) > maxReportBlock {
		block := f.block
		f.block = nil
		_, err := f.w.Write(block)
		return err
	}
	return nil
}

// Close passes on what is held back, then closes the destination.
func (f *reportFilter) Close() error {
	f.w.Write(append(f.block, f.partial...))
	f.block, f.partial = nil, nil
	return f.w.Close()
}

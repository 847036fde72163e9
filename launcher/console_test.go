package launcher

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

func TestFormatPrefix(t *testing.T) {
	tests := []struct{ template, want string }{
		{DefaultPrefixTemplate, "[rank5]: "},
		{"[${role_name}${local_rank}]:", "[trainer1]:"},
		{"${host}:${rank} ${unknown} $rank", "node0:5 ${unknown} $rank"},
		{"${hostname}|${host}> ", "node0|node0> "},
		{"", ""},
	}
	for _, tt := range tests {
		if got := FormatPrefix(tt.template, "trainer", 5, 1, "node0"); got != tt.want {
			t.Errorf("FormatPrefix(%q) = %q, want %q", tt.template, got, tt.want)
		}
	}
}

// Writers of many workers, each writing its lines in random pieces, must
// never mix two lines.
func TestConsoleNeverInterleavesLines(t *testing.T) {
	t.Parallel()
	const writers, lines = 8, 200
	var out bytes.Buffer
	console := NewConsole(&out, ConsoleOptions{})
	var wg sync.WaitGroup
	for id := range writers {
		wg.Go(func() {
			w := console.Writer(fmt.Sprintf("[w%d] ", id))
			defer w.Close()
			rng := rand.New(rand.NewPCG(uint64(id), 1))
			var stream []byte
			for n := range lines {
				stream = fmt.Appendf(stream, "w%d-line-%d-%s\n", id, n, strings.Repeat("x", rng.IntN(300)))
			}
			for len(stream) > 0 {
				piece := min(len(stream), 1+rng.IntN(64))
				w.Write(stream[:piece])
				stream = stream[piece:]
			}
		})
	}
	wg.Wait()

	line := regexp.MustCompile(`^\[w(\d+)\] w(\d+)-line-(\d+)-x*$`)
	next := make(map[string]int)
	for _, text := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		m := line.FindStringSubmatch(text)
		if m == nil || m[1] != m[2] {
			t.Fatalf("mangled line %q", text)
		}
		if n, _ := strconv.Atoi(m[3]); n != next[m[1]] {
			t.Fatalf("writer %s: line %d after line %d", m[1], n, next[m[1]]-1)
		}
		next[m[1]]++
	}
	for id := range writers {
		if got := next[strconv.Itoa(id)]; got != lines {
			t.Errorf("writer %d: %d lines, want %d", id, got, lines)
		}
	}
}

func TestConsoleLines(t *testing.T) {
	var out bytes.Buffer
	w := NewConsole(&out, ConsoleOptions{}).Writer("[rank0]: ")
	for _, piece := range []string{"dos\r\n", "split ", "line\r", "\nunix\n", "\n", "partial"} {
		w.Write([]byte(piece))
	}
	if want := "[rank0]: dos\n[rank0]: split line\n[rank0]: unix\n[rank0]: \n"; out.String() != want {
		t.Errorf("before Close: %q, want %q", out.String(), want)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out.String(), "[rank0]: partial\n") {
		t.Errorf("Close did not flush the partial line: %q", out.String())
	}
	if _, err := w.Write([]byte("late\n")); err == nil {
		t.Error("Write after Close succeeded")
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestConsoleTimestamps(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 11, 21, 21, 56, 10, 123e6, time.UTC)
	w := NewConsole(&out, ConsoleOptions{Timestamps: true, Now: func() time.Time { return now }}).Writer("[rank1]: ")
	w.Write([]byte("hello\n"))
	if want := "2026-11-21T21:56:10.123Z [rank1]: hello\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

func TestConsoleSplitsLongLines(t *testing.T) {
	var out bytes.Buffer
	w := NewConsole(&out, ConsoleOptions{}).Writer("> ")
	// A partial line is cut as soon as it is too long, not buffered whole.
	long := strings.Repeat("€", 50000) // 150000 bytes, 3 per rune
	for piece := range chunks(long, 4096) {
		w.Write([]byte(piece))
	}
	if n := strings.Count(out.String(), "\n"); n != 2 {
		t.Errorf("%d lines printed before the line ended, want 2", n)
	}
	w.Write([]byte("\n"))
	w.Write([]byte(long + "\n")) // and so is a whole one

	var joined strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		body, ok := strings.CutPrefix(line, "> ")
		if !ok || len(body) > MaxLineLength || !utf8.ValidString(body) {
			t.Fatalf("bad piece: prefix %v, %d bytes, valid UTF-8 %v", ok, len(body), utf8.ValidString(body))
		}
		joined.WriteString(body)
	}
	if joined.String() != long+long {
		t.Error("pieces do not add up to the lines written")
	}
}

// chunks cuts s into pieces of n bytes.
func chunks(s string, n int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for len(s) > 0 {
			piece := s[:min(n, len(s))]
			s = s[len(piece):]
			if !yield(piece) {
				return
			}
		}
	}
}

// A line that starts with the prefix already (torch 2.x prefixes its own
// tracebacks "[rank1]: ") is not prefixed twice; Keep drops lines.
func TestConsolePrefixOnceAndKeep(t *testing.T) {
	var out bytes.Buffer
	c := NewConsole(&out, ConsoleOptions{Keep: func(line []byte) bool { return !bytes.Contains(line, []byte("drop")) }})
	w := c.Writer("[rank1]: ")
	fmt.Fprint(w, "[rank1]: Traceback\nplain\n[rank2]: other\ndrop me\n[rank1]:no space\n")
	w.Close()
	want := "[rank1]: Traceback\n[rank1]: plain\n[rank1]: [rank2]: other\n[rank1]: [rank1]:no space\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
	out.Reset()
	w = NewConsole(&out, ConsoleOptions{}).Writer("")
	fmt.Fprint(w, "a\nb")
	w.Close()
	if out.String() != "a\nb\n" {
		t.Errorf("no prefix: got %q", out.String())
	}
}

func TestParseLineFilters(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"apple,orange", []string{"apple", "orange"}},
		{"a,,b", []string{"a,b"}},
		{",x,,", []string{"x,"}},
		{"loss,,,acc", []string{"loss,", "acc"}},
		{",,", []string{","}},
		{"a,", []string{"a"}},
	} {
		if got := ParseLineFilters(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("ParseLineFilters(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// streamOf is what one worker of the wide tests prints: lines of its own,
// numbered, of random length, in the 4 KiB pieces of C stdio on a pipe.
func streamOf(id, lines int) []byte {
	rng := rand.New(rand.NewPCG(uint64(id), 2))
	var stream []byte
	for n := range lines {
		stream = fmt.Appendf(stream, "w%d-line-%d-%s\n", id, n, strings.Repeat("x", rng.IntN(120)))
	}
	return stream
}

// checkWhole fails unless out holds every writer's lines, each whole, once
// and in order, behind its own writer's prefix.
func checkWhole(t testing.TB, out string, writers, lines int) {
	t.Helper()
	line := regexp.MustCompile(`^\[w(\d+)\] w(\d+)-line-(\d+)-x*$`)
	next := make([]int, writers)
	for text := range strings.SplitSeq(strings.TrimSuffix(out, "\n"), "\n") {
		m := line.FindStringSubmatch(text)
		if m == nil || m[1] != m[2] {
			t.Fatalf("mangled line %q", text)
		}
		id, _ := strconv.Atoi(m[1])
		if n, _ := strconv.Atoi(m[3]); n != next[id] {
			t.Fatalf("writer %d: line %d after line %d", id, n, next[id]-1)
		}
		next[id]++
	}
	for id, got := range next {
		if got != lines {
			t.Errorf("writer %d: %d lines, want %d", id, got, lines)
		}
	}
}

// 256 writers at once, as from a node of 256 workers, each writing its
// stream in 4 KiB pieces that cut lines anywhere: no line is lost, broken
// or printed twice.
func TestConsoleWideNodeKeepsEveryLineWhole(t *testing.T) {
	t.Parallel()
	const writers, lines = 256, 100
	var out bytes.Buffer
	console := NewConsole(&out, ConsoleOptions{})
	var wg sync.WaitGroup
	for id := range writers {
		wg.Go(func() {
			w := console.Writer(fmt.Sprintf("[w%d] ", id))
			for piece := range chunks(string(streamOf(id, lines)), 4096) {
				if _, err := w.Write([]byte(piece)); err != nil {
					t.Error(err)
					return
				}
			}
			if err := w.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	checkWhole(t, out.String(), writers, lines)
}

// BenchmarkConsoleWideNode is the console of a node of 256 workers, each
// printing in 4 KiB pieces, into a pipe drained by another goroutine (as
// gorun's stdout into a terminal or a log collector); it reports lines/s.
func BenchmarkConsoleWideNode(b *testing.B) {
	const writers, lines = 256, 200
	pieces := make([][][]byte, writers)
	for id := range pieces {
		for piece := range chunks(string(streamOf(id, lines)), 4096) {
			pieces[id] = append(pieces[id], []byte(piece))
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	drained := make(chan int64)
	go func() {
		n, _ := io.Copy(io.Discard, r)
		drained <- n
	}()
	out := &countingWriter{w: w}
	b.ResetTimer()
	for b.Loop() {
		console := NewConsole(out, ConsoleOptions{})
		var wg sync.WaitGroup
		for id := range writers {
			wg.Go(func() {
				cw := console.Writer(fmt.Sprintf("[w%d] ", id))
				for _, piece := range pieces[id] {
					cw.Write(piece)
				}
				cw.Close()
			})
		}
		wg.Wait()
	}
	b.StopTimer()
	w.Close()
	<-drained
	b.ReportMetric(float64(b.N*writers*lines)/b.Elapsed().Seconds(), "lines/s")
	b.ReportMetric(float64(out.writes)/float64(b.N), "writes/op")
}

// countingWriter counts the writes to w; the console serialises them.
type countingWriter struct {
	w      io.Writer
	writes int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	return c.w.Write(p)
}

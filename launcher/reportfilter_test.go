package launcher

import (
	"strings"
	"testing"
)

type closingBuffer struct {
	strings.Builder
	closed bool
}

func (b *closingBuffer) Close() error { b.closed = true; return nil }

func TestReportFilterShowsEachReportOnce(t *testing.T) {
	rule := strings.Repeat("=", 60)
	report := func(rank int) string {
		return rule + "\nw FAILED\n" + strings.Repeat("-", 60) + "\nRoot Cause (first observed failure):\n  rank: " +
			string(rune('0'+rank)) + "\n" + rule + "\n"
	}
	seen := &reportsSeen{}
	var outA, outB closingBuffer
	a, b := &reportFilter{w: &outA, seen: seen}, &reportFilter{w: &outB, seen: seen}

	// Host A's stream arrives in odd pieces; host B prints the same report.
	streamA := "log line\n" + report(3) + "after\n"
	for i := 0; i < len(streamA); i += 7 {
		a.Write([]byte(streamA[i:min(i+7, len(streamA))]))
	}
	b.Write([]byte("b's log\n" + report(3) + report(5) + rule + "\nw FAILED\npartial"))
	a.Close()
	b.Close()

	if got := outA.String(); got != streamA || !outA.closed {
		t.Errorf("host A: got %q (closed %v), want everything", got, outA.closed)
	}
	// B's copy of the same report is dropped; its other report, and a
	// report cut off by the end of the stream, pass.
	if want := "b's log\n" + report(5) + rule + "\nw FAILED\npartial"; outB.String() != want {
		t.Errorf("host B:\n%q\nwant\n%q", outB.String(), want)
	}
}

// A line longer than the console holds passes before its newline comes,
// and a rule at its end does not open a report.
func TestReportFilterPassesLongLines(t *testing.T) {
	rule := strings.Repeat("=", 60)
	var out closingBuffer
	f := &reportFilter{w: &out, seen: &reportsSeen{}}
	long := strings.Repeat("x", MaxLineLength+1)
	f.Write([]byte(long))
	if out.String() != long {
		t.Fatalf("got %d bytes of a %d-byte line before its end, want all", out.Len(), len(long))
	}
	f.Write([]byte(rule + "\nafter\n"))
	if want := long + rule + "\nafter\n"; out.String() != want {
		t.Errorf("the end of a long line opened a report: got %d bytes, want %d", out.Len(), len(want))
	}
}

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

package elastic

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
	"github.com/gorun/gorun/launcher"
)

// svgTitles parses doc as XML and returns the text of every <title> and
// <text> element: what the picture names.
func svgTitles(t *testing.T, doc []byte) string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(doc))
	d.Strict = true
	var texts []string
	var in []string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the picture is not XML: %v\n%s", err, doc)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			in = append(in, tok.Name.Local)
		case xml.EndElement:
			in = in[:len(in)-1]
		case xml.CharData:
			if len(in) > 0 && (in[len(in)-1] == "title" || in[len(in)-1] == "text" || in[len(in)-1] == "tspan" || in[len(in)-1] == "td") {
				texts = append(texts, string(tok))
			}
		}
	}
	return strings.Join(texts, "\n")
}

func TestTimelineSVG(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	exit := func(ms, rank, pid, code int, sig syscall.Signal) Event {
		return Event{Time: at(ms), Kind: EventExited, Exit: launcher.Exit{Rank: rank, LocalRank: rank, Pid: pid, ExitCode: code, Signal: sig, Time: at(ms)}}
	}
	restartJob := []Event{
		{Time: at(0), Kind: EventRound, Round: 1, Nodes: 1},
		{Time: at(10), Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{100, 101}},
		exit(900, 1, 101, 3, 0),
		exit(950, 0, 100, 143, syscall.SIGTERM),
		{Time: at(1000), Kind: EventRound, Round: 2, Restarts: 1, Nodes: 1},
		{Time: at(1010), Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{200, 201}},
		exit(2000, 0, 200, 0, 0),
		exit(2010, 1, 201, 0, 0),
	}
	tests := []struct {
		name   string
		info   TimelineInfo
		events []Event
		want   []string // what the picture must name
		absent []string
	}{
		{
			name:   "a failure and a restart",
			info:   TimelineInfo{RunID: "night<1>", Host: "n1", Result: "succeeded (1 restarts)", End: at(2100)},
			events: restartJob,
			want: []string{"gorun run night<1> on n1: ", "succeeded (1 restarts)", "rank 0", "rank 1", "round 1", "round 2 (restarts 1)",
				"rank 1 pid 101: exitcode 3", "rank 0 pid 100: signal 15 (SIGTERM)", "rank 1 restarted", "rank 0 pid 200: exitcode 0", "+1s"},
			absent: []string{"hang:", "no workers started", "running when the job ended"},
		},
		{
			name: "a hang, then a stop signal",
			info: TimelineInfo{RunID: "r", Host: "h", Result: "stopped by SIGTERM", Failed: true, End: at(5000)},
			events: []Event{
				{Time: at(0), Kind: EventRound, Round: 1, Nodes: 2},
				{Time: at(5), Kind: EventStarted, Ranks: []int{2, 3}, Pids: []int{7, 8}},
				{Time: at(3000), Kind: EventHang, Ranks: []int{3}},
				{Time: at(4000), Kind: EventSignal, Signal: "SIGTERM"},
				exit(4100, 2, 7, 143, syscall.SIGTERM),
			},
			want:   []string{"rank 2", "rank 3", "hang: ranks 3", "SIGTERM", "rank 2 pid 7: signal 15 (SIGTERM)", "rank 3 pid 8: running when the job ended"},
			absent: []string{"rank 0", "restarted"},
		},
		{
			name:   "no workers",
			info:   TimelineInfo{RunID: "r", Host: "h", Result: "gorun failed: <no store>", Failed: true, End: at(0)},
			events: nil,
			want:   []string{"no workers started", "gorun failed: <no store>"},
			absent: []string{"rank 0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, form := range []struct {
				name string
				doc  []byte
			}{{"svg", TimelineSVG(tt.info, tt.events)}, {"html", TimelineHTML(tt.info, tt.events)}} {
				doc := form.doc
				if form.name == "html" {
					// The page is XHTML-clean but for its doctype.
					doc = bytes.TrimPrefix(doc, []byte("<!DOCTYPE html>\n"))
					if bytes.Contains(doc, []byte("<script")) || bytes.Contains(doc, []byte("http://")) && !bytes.Contains(doc, []byte(`xmlns="http://www.w3.org/2000/svg"`)) {
						t.Errorf("the page has a script or an outside link")
					}
				}
				texts := svgTitles(t, doc)
				for _, w := range tt.want {
					if !strings.Contains(texts, w) {
						t.Errorf("%s: missing %q in:\n%s", form.name, w, texts)
					}
				}
				for _, a := range tt.absent {
					if strings.Contains(texts, a) {
						t.Errorf("%s: has %q in:\n%s", form.name, a, texts)
					}
				}
			}
		})
	}
}

// TestBuildTimelineStates checks how each start's bar is coloured: the
// first failure is the failure, the SIGTERMs that follow it the stop's.
func TestBuildTimelineStates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ev := func(ms int, e Event) Event { e.Time = t0.Add(time.Duration(ms) * time.Millisecond); return e }
	x := func(pid, code int, sig syscall.Signal) Event {
		return Event{Kind: EventExited, Exit: launcher.Exit{Pid: pid, ExitCode: code, Signal: sig}}
	}
	tests := []struct {
		name   string
		events []Event
		want   map[int][]runState
	}{
		{"all ok", []Event{ev(0, Event{Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{1, 2}}), ev(5, x(1, 0, 0)), ev(6, x(2, 0, 0))},
			map[int][]runState{0: {runOK}, 1: {runOK}}},
		{"a failure stops the other", []Event{ev(0, Event{Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{1, 2}}), ev(5, x(2, 1, 0)), ev(6, x(1, 143, syscall.SIGTERM))},
			map[int][]runState{0: {runStopped}, 1: {runFailed}}},
		{"exit 143 after a failure is the stop's", []Event{ev(0, Event{Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{1, 2}}), ev(5, x(2, 1, 0)), ev(6, x(1, 143, 0))},
			map[int][]runState{0: {runStopped}, 1: {runFailed}}},
		{"exit 7 after a failure is a failure", []Event{ev(0, Event{Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{1, 2}}), ev(5, x(2, 1, 0)), ev(6, x(1, 7, 0))},
			map[int][]runState{0: {runFailed}, 1: {runFailed}}},
		{"a SIGKILL first is a failure", []Event{ev(0, Event{Kind: EventStarted, Ranks: []int{0}, Pids: []int{1}}), ev(5, x(1, 137, syscall.SIGKILL))},
			map[int][]runState{0: {runFailed}}},
		{"restart, one still running", []Event{
			ev(0, Event{Kind: EventStarted, Ranks: []int{4, 5}, Pids: []int{1, 2}}), ev(5, x(1, 1, 0)), ev(6, x(2, 143, syscall.SIGTERM)),
			ev(10, Event{Kind: EventStarted, Ranks: []int{4, 5}, Pids: []int{3, 4}}), ev(15, x(3, 0, 0))},
			map[int][]runState{4: {runFailed, runOK}, 5: {runStopped, runRunning}}},
		{"a signal's SIGTERMs are the stop's", []Event{ev(0, Event{Kind: EventStarted, Ranks: []int{0}, Pids: []int{1}}), ev(3, Event{Kind: EventSignal, Signal: "SIGTERM"}), ev(5, x(1, 143, syscall.SIGTERM))},
			map[int][]runState{0: {runStopped}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := buildTimeline(TimelineInfo{End: t0.Add(time.Second)}, tt.events)
			if len(m.runs) != len(tt.want) {
				t.Fatalf("ranks %v, want %v", m.ranks, tt.want)
			}
			for rank, want := range tt.want {
				rs := m.runs[rank]
				if len(rs) != len(want) {
					t.Fatalf("rank %d: %d runs, want %d", rank, len(rs), len(want))
				}
				for i, r := range rs {
					if r.state != want[i] {
						t.Errorf("rank %d run %d: state %d, want %d", rank, i, r.state, want[i])
					}
					if r.restart != (i > 0) {
						t.Errorf("rank %d run %d: restart %v", rank, i, r.restart)
					}
				}
			}
		})
	}
}

func TestTickStep(t *testing.T) {
	for _, tt := range []struct{ span, want time.Duration }{
		{100 * time.Millisecond, 10 * time.Millisecond},
		{2 * time.Second, 200 * time.Millisecond},
		{95 * time.Second, 10 * time.Second},
		{8 * time.Hour, time.Hour},
		{30 * 24 * time.Hour, 96 * time.Hour},
	} {
		if got := tickStep(tt.span); got != tt.want {
			t.Errorf("tickStep(%v) = %v, want %v", tt.span, got, tt.want)
		}
		if n := tt.span / tickStep(tt.span); n > tlMaxTicks {
			t.Errorf("tickStep(%v): %d ticks", tt.span, n)
		}
	}
}

// TestTimelineDrawsAHang draws a hang with rsvg-convert and finds its
// mark in the stuck rank's row only, and the running bars' colour in both.
func TestTimelineDrawsAHang(t *testing.T) {
	rsvg := testenv.MustHaveCommand(t, "rsvg-convert", "librsvg2-bin")
	t0 := time.Unix(1000, 0)
	svg := TimelineSVG(TimelineInfo{RunID: "r", Host: "h", Result: "stopped by SIGTERM", Failed: true, End: t0.Add(10 * time.Second)}, []Event{
		{Time: t0, Kind: EventRound, Nodes: 1},
		{Time: t0, Kind: EventStarted, Ranks: []int{0, 1}, Pids: []int{7, 8}},
		{Time: t0.Add(5 * time.Second), Kind: EventHang, Ranks: []int{1}},
	})
	cmd := exec.Command(rsvg, "--format", "png")
	cmd.Stdin = bytes.NewReader(svg)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("rsvg-convert: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	count := func(row int, colour string) (n int) {
		var r0, g0, b0 int
		if _, err := fmt.Sscanf(colour, "#%02x%02x%02x", &r0, &g0, &b0); err != nil {
			t.Fatal(err)
		}
		near := func(a uint32, b int) bool { return int(a>>8)-b <= 6 && b-int(a>>8) <= 6 }
		for y := tlTop + row*tlRowH; y < tlTop+(row+1)*tlRowH; y++ {
			for x := tlLeft; x < tlWidth-tlRight; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if near(r, r0) && near(g, g0) && near(b, b0) {
					n++
				}
			}
		}
		return n
	}
	// The hang's line, 2 pixels wide, crosses every row; the stuck
	// rank's row also has the ring around it.
	line := tlRowH * 2
	if n := count(1, hangColour); n < line+40 {
		t.Errorf("%d pixels of the hang's colour in rank 1's row, want its line and its ring", n)
	}
	if n := count(0, hangColour); n > line {
		t.Errorf("%d pixels of the hang's colour in rank 0's row, more than the hang's line (%d)", n, line)
	}
	for row := range 2 {
		if n := count(row, runColours[runRunning]); n < 1000 {
			t.Errorf("row %d: %d pixels of the running bar's colour", row, n)
		}
	}
}

package elastic

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/launcher"
)

// EventKind is what a timeline Event records.
type EventKind int

const (
	// EventRound is a rendezvous round completed: this node has its place.
	EventRound EventKind = iota + 1
	// EventStarted is an attempt's workers started.
	EventStarted
	// EventExited is one worker exited.
	EventExited
	// EventHang is a hang detected (--hang-timeout).
	EventHang
	// EventSignal is a stop signal that ended the job on this node.
	EventSignal
)

// Event is one thing the agent did or saw, for the job's timeline
// (gorun --report).
type Event struct {
	Time time.Time
	Kind EventKind
	// Round, Restarts and Nodes describe an EventRound.
	Round, Restarts, Nodes int
	// Ranks are the global ranks an EventStarted started, slot by slot,
	// or those an EventHang found stuck; Pids are the started workers'.
	Ranks, Pids []int
	// Exit is an EventExited's worker and status.
	Exit launcher.Exit
	// Signal names an EventSignal's signal.
	Signal string
}

// Timeline records the agent's events (Options.Timeline); a nil one
// records nothing.
type Timeline struct {
	mu     sync.Mutex
	events []Event
}

// NewTimeline returns an empty recorder.
func NewTimeline() *Timeline { return &Timeline{} }

// Events returns what was recorded so far, in order.
func (t *Timeline) Events() []Event {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.events)
}

func (t *Timeline) add(e Event) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.events = append(t.events, e)
	t.mu.Unlock()
}

func (t *Timeline) round(now time.Time, r *round) {
	t.add(Event{Time: now, Kind: EventRound, Round: r.number, Restarts: r.restarts, Nodes: r.ranks.GroupWorldSize})
}

func (t *Timeline) started(now time.Time, att *attempt) {
	pids := att.group.Pids()
	ranks := make([]int, len(pids))
	for slot := range pids {
		ranks[slot] = att.baseRank + slot
	}
	t.add(Event{Time: now, Kind: EventStarted, Ranks: ranks, Pids: pids})
}

func (t *Timeline) exited(e launcher.Exit) {
	t.add(Event{Time: e.Time, Kind: EventExited, Exit: e})
}

// hung records the hang h has just found.
func (t *Timeline) hung(now time.Time, h *hangCheck) {
	ranks := make([]int, 0, len(h.stuck))
	for _, s := range h.stuck {
		ranks = append(ranks, s.rank)
	}
	slices.Sort(ranks)
	t.add(Event{Time: now, Kind: EventHang, Ranks: ranks})
}

// signalled records the stop signal sig as it comes; only the first,
// which stops the job, is drawn.
func (t *Timeline) signalled(now time.Time, sig syscall.Signal) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.ContainsFunc(t.events, func(e Event) bool { return e.Kind == EventSignal }) {
		return
	}
	t.events = append(t.events, Event{Time: now, Kind: EventSignal, Signal: signalName(sig)})
}

// TimelineInfo is what the timeline's title says, and when the job ended.
type TimelineInfo struct {
	RunID, Host string
	// Result is how the job ended on this node, in words; Failed colours it.
	Result string
	Failed bool
	End    time.Time
}

// TimelineResult says in words how the job ended on this node: result is
// the agent's, err its own failure.
func TimelineResult(r *Result, err error) (text string, failed bool) {
	switch {
	case err != nil:
		return "gorun failed: " + err.Error(), true
	case r.Interrupted != "":
		return fmt.Sprintf("stopped by %s (exit %d, %d restarts)", r.Interrupted, r.ExitCode, r.Restarts), true
	case len(r.Failures) > 0:
		f := r.Failures[0]
		return fmt.Sprintf("failed: rank %d on %s, %s (exit %d, %d restarts)", f.Rank, f.Host, f.Exit, r.ExitCode, r.Restarts), true
	}
	return fmt.Sprintf("succeeded (%d restarts)", r.Restarts), false
}

// How a worker's run ended, which colours its bar.
type runState int

const (
	runRunning runState = iota // still running when the job ended here
	runOK
	runFailed
	runStopped // ended by gorun's stop, after a failure, hang or signal
)

var runColours = [...]string{runRunning: "#4a7fd4", runOK: "#2e9e44", runFailed: "#d62728", runStopped: "#f0a030"}

const (
	hangColour   = "#9b30d0"
	signalColour = "#111111"
	roundColour  = "#666666"
)

// run is one start of one rank, to its exit or the job's end.
type run struct {
	start, end time.Time
	pid        int
	restart    bool // not the rank's first start
	exit       *launcher.Exit
	state      runState
}

// mark is a moment drawn across the rows: a round, a hang or a signal.
type mark struct {
	at    time.Time
	kind  EventKind
	label string
	ranks []int // a hang's stuck ranks
}

// timelineModel is what the picture shows, worked out from the events.
type timelineModel struct {
	t0, t1 time.Time
	ranks  []int
	runs   map[int][]run
	marks  []mark
}

func buildTimeline(info TimelineInfo, events []Event) timelineModel {
	m := timelineModel{runs: map[int][]run{}}
	// open maps a local slot's pid to its rank's current run.
	open := map[int]int{}
	stopping := false
	for _, e := range events {
		if m.t0.IsZero() || e.Time.Before(m.t0) {
			m.t0 = e.Time
		}
		m.t1 = maxTime(m.t1, e.Time)
		switch e.Kind {
		case EventRound:
			label := "round " + strconv.Itoa(e.Round)
			if e.Restarts > 0 {
				label += " (restarts " + strconv.Itoa(e.Restarts) + ")"
			}
			m.marks = append(m.marks, mark{at: e.Time, kind: e.Kind, label: label})
		case EventStarted:
			stopping = false
			clear(open)
			for i, rank := range e.Ranks {
				var pid int
				if i < len(e.Pids) {
					pid = e.Pids[i]
				}
				open[pid] = rank
				m.runs[rank] = append(m.runs[rank], run{start: e.Time, pid: pid, restart: len(m.runs[rank]) > 0})
			}
		case EventExited:
			rank, ok := open[e.Exit.Pid]
			rs := m.runs[rank]
			if !ok || len(rs) == 0 {
				continue
			}
			delete(open, e.Exit.Pid)
			r := &rs[len(rs)-1]
			x := e.Exit
			r.end, r.exit = e.Time, &x
			switch {
			case !x.Failed():
				r.state = runOK
			case stopping && stoppedExit(x):
				r.state = runStopped
			default:
				r.state = runFailed
				stopping = true
			}
		case EventHang:
			stopping = true
			m.marks = append(m.marks, mark{at: e.Time, kind: e.Kind, label: "hang: ranks " + joinInts(e.Ranks), ranks: e.Ranks})
		case EventSignal:
			stopping = true
			m.marks = append(m.marks, mark{at: e.Time, kind: e.Kind, label: e.Signal})
		}
	}
	m.t1 = maxTime(m.t1, info.End)
	if m.t0.IsZero() {
		m.t0 = m.t1
	}
	for rank, rs := range m.runs {
		for i := range rs {
			if rs[i].exit == nil {
				rs[i].end = m.t1
			}
		}
		m.runs[rank] = rs
	}
	m.ranks = slices.Sorted(maps.Keys(m.runs))
	return m
}

// The picture's layout, in pixels.
const (
	tlWidth    = 1000
	tlLeft     = 90
	tlRight    = 30
	tlTop      = 70
	tlRowH     = 30
	tlBarH     = 16
	tlFootH    = 80
	tlMinSpan  = 100 * time.Millisecond
	tlMaxTicks = 10
)

// TimelineSVG draws the job on this node: a row per rank over time, each
// start a bar coloured by how it ended, rounds, hangs and stop signals
// marked across the rows, a time axis, a legend and a title line.
func TimelineSVG(info TimelineInfo, events []Event) []byte {
	m := buildTimeline(info, events)
	span := max(m.t1.Sub(m.t0), tlMinSpan)
	plotW := float64(tlWidth - tlLeft - tlRight)
	x := func(t time.Time) float64 { return tlLeft + plotW*float64(t.Sub(m.t0))/float64(span) }
	rows := max(len(m.ranks), 1)
	bottom := tlTop + rows*tlRowH
	height := bottom + tlFootH
	rowOf := make(map[int]int, len(m.ranks))
	for i, r := range m.ranks {
		rowOf[r] = i
	}

	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", tlWidth, height, tlWidth, height)
	p(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	titleColour := runColours[runOK]
	if info.Failed {
		titleColour = runColours[runFailed]
	}
	p(`<text x="10" y="22" font-size="15" font-weight="bold">gorun run %s on %s: <tspan fill="%s">%s</tspan></text>`+"\n",
		esc(cmp.Or(info.RunID, "?")), esc(cmp.Or(info.Host, "?")), titleColour, esc(info.Result))
	p(`<text x="10" y="42" fill="#444">started %s, lasted %s</text>`+"\n", m.t0.UTC().Format("2006-01-02 15:04:05.000 MST"), roundSpan(m.t1.Sub(m.t0)))

	// Rows: banded backgrounds and rank labels.
	for i, rank := range m.ranks {
		y := tlTop + i*tlRowH
		if i%2 == 0 {
			p(`<rect x="%d" y="%d" width="%d" height="%d" fill="#f2f2f2"/>`+"\n", tlLeft, y, int(plotW), tlRowH)
		}
		p(`<text x="%d" y="%d" text-anchor="end">rank %d</text>`+"\n", tlLeft-8, y+tlRowH/2+4, rank)
	}
	if len(m.ranks) == 0 {
		p(`<text x="%d" y="%d" fill="#444">no workers started</text>`+"\n", tlLeft, tlTop+tlRowH/2+4)
	}

	// Axis: ticks at a round step, as offsets from the start.
	step := tickStep(span)
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>`+"\n", tlLeft, bottom, tlWidth-tlRight, bottom)
	for d := time.Duration(0); d <= span; d += step {
		tx := x(m.t0.Add(d))
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`, tx, tlTop, tx, bottom)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333"/>`, tx, bottom, tx, bottom+5)
		p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#333">+%s</text>`+"\n", tx, bottom+18, d)
	}

	// Bars: one per start, coloured by how it ended; restarts and exits marked.
	for _, rank := range m.ranks {
		y := tlTop + rowOf[rank]*tlRowH + (tlRowH-tlBarH)/2
		for _, r := range m.runs[rank] {
			x0, x1 := x(r.start), x(r.end)
			w := max(x1-x0, 2)
			status := "running when the job ended"
			if r.exit != nil {
				status = r.exit.String()
			}
			p(`<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="%s"><title>rank %d pid %d: %s</title></rect>`+"\n",
				x0, y, w, tlBarH, runColours[r.state], rank, r.pid, esc(status))
			if w > 60 {
				p(`<text x="%.1f" y="%d" fill="#fff" font-size="10">pid %d</text>`+"\n", x0+4, y+tlBarH-4, r.pid)
			}
			if r.restart {
				// A restart: a dark wedge at the bar's start.
				p(`<path d="M%.1f %d l8 %d l-8 %d z" fill="#222"><title>rank %d restarted</title></path>`+"\n", x0, y-3, tlBarH/2+3, tlBarH/2+3, rank)
			}
			if r.exit != nil {
				cy := y + tlBarH/2
				p(`<path d="M%.1f %d l6 6 l-6 6 l-6 -6 z" fill="%s" stroke="#000" stroke-width="1"><title>rank %d %s</title></path>`+"\n",
					x1, cy-6, runColours[r.state], rank, esc(r.exit.String()))
			}
		}
	}

	// Marks across the rows: rounds (dashed), hangs and stop signals.
	for i, mk := range m.marks {
		mx := x(mk.at)
		ly := tlTop - 8 - (i%2)*12 // alternate heights so that close labels do not overlap
		// A label near the right edge ends at its mark rather than being cut off.
		lx, anchor := mx+2, "start"
		if mx > tlWidth-tlRight-7*float64(len(mk.label)) {
			lx, anchor = mx-2, "end"
		}
		switch mk.kind {
		case EventRound:
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-dasharray="4 3"/>`, mx, tlTop-4, mx, bottom, roundColour)
			p(`<text x="%.1f" y="%d" text-anchor="%s" fill="%s" font-size="10">%s</text>`+"\n", lx, ly, anchor, roundColour, esc(mk.label))
		case EventHang:
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"/>`, mx, tlTop-4, mx, bottom, hangColour)
			for _, rank := range mk.ranks {
				if row, ok := rowOf[rank]; ok {
					p(`<circle cx="%.1f" cy="%d" r="7" fill="none" stroke="%s" stroke-width="3"/>`, mx, tlTop+row*tlRowH+tlRowH/2, hangColour)
				}
			}
			p(`<text x="%.1f" y="%d" text-anchor="%s" fill="%s" font-size="10" font-weight="bold">%s</text>`+"\n", lx, ly, anchor, hangColour, esc(mk.label))
		case EventSignal:
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"/>`, mx, tlTop-4, mx, bottom, signalColour)
			p(`<text x="%.1f" y="%d" text-anchor="%s" fill="%s" font-size="10" font-weight="bold">%s</text>`+"\n", lx, ly, anchor, signalColour, esc(mk.label))
		}
	}

	// Legend.
	ly := bottom + 40
	lx := tlLeft
	for _, it := range []struct {
		s    runState
		text string
	}{{runOK, "exited 0"}, {runFailed, "failed"}, {runStopped, "stopped by gorun"}, {runRunning, "running at the end"}} {
		p(`<rect x="%d" y="%d" width="14" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", lx, ly, runColours[it.s], lx+18, ly+9, it.text)
		lx += 30 + 7*len(it.text)
	}
	for _, it := range []struct{ colour, dash, text string }{
		{roundColour, "4 3", "rendezvous round"}, {hangColour, "", "hang"}, {signalColour, "", "stop signal"},
	} {
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2" stroke-dasharray="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, ly+5, lx+14, ly+5, it.colour, cmp.Or(it.dash, "none"), lx+18, ly+9, it.text)
		lx += 30 + 7*len(it.text)
	}
	p(`<path d="M%d %d l6 6 l-6 6 l-6 -6 z" fill="#fff" stroke="#000"/><text x="%d" y="%d">exit</text>`+"\n", lx+6, ly-1, lx+16, ly+9)
	lx += 50
	p(`<path d="M%d %d l8 8 l-8 8 z" fill="#222"/><text x="%d" y="%d">restart</text>`+"\n", lx, ly-3, lx+12, ly+9)
	p("</svg>\n")
	return b.Bytes()
}

// TimelineHTML is a self-contained page around TimelineSVG, with the
// events listed as text below it: no script, no outside asset.
func TimelineHTML(info TimelineInfo, events []Event) []byte {
	var b bytes.Buffer
	title := "gorun " + cmp.Or(info.RunID, "?") + " on " + cmp.Or(info.Host, "?") + ": " + info.Result
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>%s</title>\n", esc(title))
	b.WriteString("<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #ddd}</style>\n</head><body>\n")
	b.Write(TimelineSVG(info, events))
	b.WriteString("<h3>Events</h3>\n<table><tr><th>time</th><th>event</th></tr>\n")
	for _, e := range events {
		fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td></tr>\n", e.Time.UTC().Format("15:04:05.000"), esc(describe(e)))
	}
	b.WriteString("</table>\n</body></html>\n")
	return b.Bytes()
}

// describe says what e is, in words.
func describe(e Event) string {
	switch e.Kind {
	case EventRound:
		return fmt.Sprintf("rendezvous round %d complete: %d nodes, %d restarts", e.Round, e.Nodes, e.Restarts)
	case EventStarted:
		return fmt.Sprintf("started ranks %s (pids %s)", joinInts(e.Ranks), joinInts(e.Pids))
	case EventExited:
		return fmt.Sprintf("rank %d (pid %d) exited: %s", e.Exit.Rank, e.Exit.Pid, e.Exit)
	case EventHang:
		return "hang detected: ranks " + joinInts(e.Ranks) + " made no collective progress"
	case EventSignal:
		return "stopped by " + e.Signal
	}
	return "?"
}

// stoppedExit tells whether x is how a worker ends when gorun stops it:
// by SIGTERM, SIGKILL or SIGINT, or by exiting as a shell does on one
// (128+signal).
func stoppedExit(x launcher.Exit) bool {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGINT} {
		if x.Signal == sig || x.Signal == 0 && x.ExitCode == 128+int(sig) {
			return true
		}
	}
	return false
}

// tickStep is the round step that puts at most tlMaxTicks ticks on span.
func tickStep(span time.Duration) time.Duration {
	for _, s := range []time.Duration{
		10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour,
	} {
		if span/s <= tlMaxTicks {
			return s
		}
	}
	return 24 * time.Hour * (span/(24*time.Hour)/tlMaxTicks + 1)
}

func roundSpan(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

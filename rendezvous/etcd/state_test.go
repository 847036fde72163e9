package etcd

import (
	"testing"
)

func TestNextStep(t *testing.T) {
	full := &roster{Nodes: []member{{ID: "a"}, {ID: "b"}, {ID: "c"}}}
	short := &roster{Nodes: []member{{ID: "a"}, {ID: "b"}}}
	void := &roster{}
	cases := []struct {
		name string
		v    view
		want step
	}{
		{"the job moved on", view{moved: true, roster: full, member: true}, stepRetry},
		{"decided with this node", view{roster: full, member: true}, stepTakePart},
		{"decided full without it: spare", view{roster: full, arrivals: 4}, stepSpare},
		{"decided below max without it: a late joiner opens the next", view{roster: short, arrivals: 3}, stepOpenNext},
		{"voided by another at its deadline: open the next", view{roster: void, arrivals: 1}, stepOpenNext},
		{"decided without it at its deadline", view{roster: short, pastDeadline: true}, stepTimedOut},
		{"max arrived: decide at once", view{arrivals: 3}, stepDecide},
		{"more than max arrived: decide", view{arrivals: 5}, stepDecide},
		{"min arrived, last call open", view{arrivals: 2}, stepWait},
		{"min arrived, last call over", view{arrivals: 2, lastCallDue: true}, stepDecide},
		{"last call over, but a joiner left", view{arrivals: 1, lastCallDue: true}, stepWait},
		{"deadline with min", view{arrivals: 2, pastDeadline: true}, stepDecide},
		{"deadline below min: void", view{arrivals: 1, pastDeadline: true}, stepVoid},
		{"alone, waiting", view{arrivals: 1}, stepWait},
	}
	for _, c := range cases {
		c.v.minNodes, c.v.maxNodes = 2, 3
		if got := nextStep(c.v); got != c.want {
			t.Errorf("%s: nextStep(%+v) = %v, want %v", c.name, c.v, got, c.want)
		}
	}
}

func TestJobStateTransitions(t *testing.T) {
	cases := []struct {
		from       jobState
		maxRestart int
		want       jobState
	}{
		{jobState{0, 0, running}, 3, jobState{1, 1, running}},
		{jobState{4, 2, running}, 3, jobState{5, 3, running}},
		{jobState{5, 3, running}, 3, jobState{6, 3, failed}},
		{jobState{0, 0, running}, 0, jobState{1, 0, failed}},
	}
	for _, c := range cases {
		if got := c.from.afterFailure(c.maxRestart); got != c.want {
			t.Errorf("%v.afterFailure(%d) = %v, want %v", c.from, c.maxRestart, got, c.want)
		}
		back, err := parseJobState([]byte(c.want.String()))
		if err != nil || back != c.want {
			t.Errorf("parse(%q) = %v, %v", c.want.String(), back, err)
		}
	}
	for _, bad := range []string{"", "1", "a b", "1 2 gone", "-1 0", "1 2 3 4"} {
		if _, err := parseJobState([]byte(bad)); err == nil {
			t.Errorf("parseJobState(%q) accepted", bad)
		}
	}
}

func TestOrder(t *testing.T) {
	ms := []member{
		{ID: "late", Rank: -1, arrival: 30},
		{ID: "old", Rank: -1, Since: 5, arrival: 40},
		{ID: "new", Rank: -1, arrival: 20},
	}
	got := order(ms)
	want := []string{"old", "new", "late"}
	for i, m := range got {
		if m.ID != want[i] {
			t.Fatalf("order: got %v, want %v", ids(got), want)
		}
	}
	// Every node asked for a rank: the requests decide.
	ms = []member{{ID: "b", Rank: 1, arrival: 1}, {ID: "a", Rank: 0, arrival: 2}}
	if got := ids(order(ms)); got[0] != "a" || got[1] != "b" {
		t.Fatalf("order by request: got %v", got)
	}
	ro := roster{Nodes: []member{{ID: "a", NProc: 2}, {ID: "b", NProc: 3}, {ID: "c", NProc: 1}}}
	p, ok := ro.placeOf("b")
	if !ok || p != (place{groupRank: 1, firstRank: 2, worldSize: 6}) {
		t.Fatalf("placeOf(b) = %+v, %v", p, ok)
	}
	if _, ok := ro.placeOf("z"); ok {
		t.Fatal("placeOf(z): a stranger has a place")
	}
}

func ids(ms []member) []string {
	var s []string
	for _, m := range ms {
		s = append(s, m.ID)
	}
	return s
}

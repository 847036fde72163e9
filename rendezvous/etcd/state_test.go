package etcd

import (
	"testing"
)

func TestNextStep(t *testing.T) {
	cases := []struct {
		name string
		v    view
		want step
	}{
		{"the job moved on", view{moved: true, decided: true, size: 3, member: true}, stepRetry},
		{"decided with this node", view{decided: true, size: 3, member: true}, stepTakePart},
		{"decided full without it: spare", view{decided: true, size: 3, arrivals: 4}, stepSpare},
		{"decided below max without it: a late joiner opens the next", view{decided: true, size: 2, arrivals: 3}, stepOpenNext},
		{"voided by another at its deadline: open the next", view{decided: true, arrivals: 1}, stepOpenNext},
		{"decided without it at its deadline", view{decided: true, size: 2, pastDeadline: true}, stepTimedOut},
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
	ro := roster{Rev: 9, Nodes: []member{{ID: "a", NProc: 2}, {ID: "b", NProc: 3}, {ID: "c", NProc: 1}}}
	d, seats := ro.decide("c")
	if d != (decision{Rev: 9, By: "c", N: 3, World: 6}) {
		t.Fatalf("decision = %+v", d)
	}
	if b := seats[1]; b.ID != "b" || b.GroupRank != 1 || b.FirstRank != 2 {
		t.Fatalf("seat of b = %+v", b)
	}
	if c := seats[2]; c.GroupRank != 2 || c.FirstRank != 5 {
		t.Fatalf("seat of c = %+v", c)
	}
}

func ids(ms []member) []string {
	var s []string
	for _, m := range ms {
		s = append(s, m.ID)
	}
	return s
}

func TestThere(t *testing.T) {
	cases := []struct {
		name string
		s    snapshot
		want int
	}{
		{"no shortage: the joins counted", snapshot{arrivals: 5}, 5},
		{"a decider found two withdrawn", snapshot{arrivals: 5, short: &shortage{arrivals: 5, found: 3}}, 3},
		{"and one joined since", snapshot{arrivals: 6, short: &shortage{arrivals: 5, found: 3}}, 4},
	}
	for _, c := range cases {
		if got := c.s.there(); got != c.want {
			t.Errorf("%s: there() = %d, want %d", c.name, got, c.want)
		}
	}
}

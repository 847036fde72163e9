package jobstate

import (
	"strings"
	"testing"
)

func TestAfterFailure(t *testing.T) {
	cases := []struct {
		from        State
		maxRestarts int
		want        State
		reason      string
	}{
		{State{0, 0, Running}, 3, State{1, 1, Running}, "node n on h failed: restart 1 of 3"},
		{State{4, 2, Running}, 3, State{5, 3, Running}, "node n on h failed: restart 3 of 3"},
		{State{5, 3, Running}, 3, State{6, 3, Failed}, "node n on h failed: restart budget of 3 spent, job failed"},
		{State{0, 0, Running}, 0, State{1, 0, Failed}, "node n on h failed: restart budget of 0 spent, job failed"},
	}
	for _, c := range cases {
		got := c.from.AfterFailure(c.maxRestarts)
		if got != c.want {
			t.Errorf("%v.AfterFailure(%d) = %v, want %v", c.from, c.maxRestarts, got, c.want)
		}
		if r := got.FailureReason("n", "h", c.maxRestarts); r != c.reason {
			t.Errorf("%v.FailureReason = %q, want %q", got, r, c.reason)
		}
	}
}

func TestSupersededAndEnding(t *testing.T) {
	from := State{Round: 4, Restarts: 2}
	if got, want := from.Superseded(), (State{Round: 5, Restarts: 2}); got != want {
		t.Errorf("%v.Superseded() = %v, want %v", from, got, want)
	}
	if got, want := from.Ending(), (State{Round: 5, Restarts: 2, End: Ended}); got != want {
		t.Errorf("%v.Ending() = %v, want %v", from, got, want)
	}
}

func TestParse(t *testing.T) {
	for _, s := range []State{{}, {Round: 7, Restarts: 2}, {Round: 8, Restarts: 2, End: Failed}, {Round: 3, End: Ended}} {
		got, err := Parse(s.Bytes())
		if err != nil || got != s {
			t.Errorf("Parse(%q) = %+v, %v", s, got, err)
		}
	}
	for _, bad := range []string{"", "1", "1 x", "a b", "-1 0", "0 -2", "1 2 maybe", "1 2 3 4"} {
		_, err := Parse([]byte(bad))
		if err == nil || !strings.Contains(err.Error(), "malformed job state") {
			t.Errorf("Parse(%q) = %v, want a malformed job state error", bad, err)
		}
	}
}

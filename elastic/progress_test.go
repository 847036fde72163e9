package elastic

import (
	"slices"
	"testing"
	"time"
)

func TestStaticWaiting(t *testing.T) {
	for _, tc := range []struct {
		name           string
		raw            string
		nnodes         int
		joined         int
		names, missing []string
		text           string
	}{
		{name: "node 0 alone", raw: `{"rank":0,"host":"gpu1"}` + "\n", nnodes: 2, joined: 1,
			names: []string{"gpu1 (node rank 0)"}, missing: []string{"node rank 1"}, text: "node rank 1"},
		{name: "by rank, not arrival", raw: `{"rank":2,"host":"c"}` + "\n" + `{"rank":0,"host":"a"}` + "\n", nnodes: 4, joined: 2,
			names: []string{"a (node rank 0)", "c (node rank 2)"}, missing: []string{"node rank 1", "node rank 3"},
			text: "node rank 1, node rank 3"},
		{name: "a node arrives twice", raw: `{"rank":1,"host":"b"}` + "\n" + `{"rank":1,"host":"b"}` + "\n", nnodes: 2, joined: 1,
			names: []string{"b (node rank 1)"}, missing: []string{"node rank 0"}, text: "node rank 0"},
		{name: "no arrivals: missing unknown", nnodes: 3, text: "3 nodes"},
		{name: "garbage and ranks out of range skipped", raw: "x\n" + `{"rank":5,"host":"z"}` + "\n" + `{"rank":0,"host":"a"}`,
			nnodes: 2, joined: 1, names: []string{"a (node rank 0)"}, missing: []string{"node rank 1"}, text: "node rank 1"},
	} {
		w := staticWaiting([]byte(tc.raw), tc.nnodes, 5*time.Second)
		if w.Joined != tc.joined || !slices.Equal(w.Names, tc.names) || !slices.Equal(w.Missing, tc.missing) ||
			w.Min != tc.nnodes || w.Max != tc.nnodes || w.Left != 5*time.Second {
			t.Errorf("%s: staticWaiting = %+v, want joined %d names %q missing %q", tc.name, w, tc.joined, tc.names, tc.missing)
		}
		if got := w.MissingText(); got != tc.text {
			t.Errorf("%s: MissingText = %q, want %q", tc.name, got, tc.text)
		}
	}
}

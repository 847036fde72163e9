package elastic

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// readOnly fails every write: RemoteStatus must never write to a job's store.
type readOnly struct{ rendezvous.Store }

var errWrite = errors.New("a write to the job's store")

func (readOnly) Set(context.Context, string, []byte) error         { return errWrite }
func (readOnly) Add(context.Context, string, int64) (int64, error) { return 0, errWrite }
func (readOnly) CompareSet(context.Context, string, []byte, []byte) ([]byte, error) {
	return nil, errWrite
}
func (readOnly) Delete(context.Context, string) (bool, error)       { return false, errWrite }
func (readOnly) MultiSet(context.Context, []string, [][]byte) error { return errWrite }
func (readOnly) Append(context.Context, string, []byte) error       { return errWrite }

func publish(t *testing.T, s rendezvous.Store, docs ...NodeStatus) {
	t.Helper()
	for _, d := range docs {
		v, _ := json.Marshal(d)
		if err := s.Set(context.Background(), statusKey(d.NodeRank), v); err != nil {
			t.Fatal(err)
		}
	}
}

func nodeRanks(docs []NodeStatus) []int {
	var r []int
	for _, d := range docs {
		r = append(r, d.NodeRank)
	}
	return r
}

func TestRemoteStatus(t *testing.T) {
	ctx := context.Background()
	two := []NodeStatus{{RunID: "j", NodeRank: 0, Nodes: 2}, {RunID: "j", NodeRank: 1, Nodes: 2}}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, s rendezvous.Store)
		want  []int
		err   bool
	}{
		{"static", func(t *testing.T, s rendezvous.Store) { publish(t, rendezvous.StaticRoundStore(s, "j"), two...) }, []int{0, 1}, false},
		{"dynamic, the current round", func(t *testing.T, s rendezvous.Store) {
			s.Set(ctx, "rdzv/j/state", []byte("3 1"))
			publish(t, rendezvous.DynamicRoundStore(s, "j", 2), two[0])
			publish(t, rendezvous.DynamicRoundStore(s, "j", 3), two...)
		}, []int{0, 1}, false},
		{"dynamic, a round forming: the last one's", func(t *testing.T, s rendezvous.Store) {
			s.Set(ctx, "rdzv/j/state", []byte("4 1"))
			publish(t, rendezvous.DynamicRoundStore(s, "j", 3), two...)
		}, []int{0, 1}, false},
		{"a node not published yet", func(t *testing.T, s rendezvous.Store) {
			s.Set(ctx, "rdzv/j/state", []byte("0 0"))
			publish(t, rendezvous.DynamicRoundStore(s, "j", 0), two[1])
			publish(t, rendezvous.DynamicRoundStore(s, "j", 0), NodeStatus{RunID: "j", NodeRank: 0, Nodes: 3})
		}, []int{0, 1}, false},
		{"nothing", func(t *testing.T, s rendezvous.Store) {}, nil, false},
		{"a malformed state", func(t *testing.T, s rendezvous.Store) { s.Set(ctx, "rdzv/j/state", []byte("x")) }, nil, true},
		{"a malformed document", func(t *testing.T, s rendezvous.Store) {
			rendezvous.StaticRoundStore(s, "j").Set(ctx, statusKey(0), []byte("{"))
		}, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := rendezvous.NewPrefixStore("", rendezvous.NewMemoryStore(time.Second))
			c.setup(t, s)
			docs, err := RemoteStatus(ctx, readOnly{s}, "j")
			if (err != nil) != c.err || !slices.Equal(nodeRanks(docs), c.want) {
				t.Errorf("RemoteStatus = nodes %v, %v; want %v, error %v", nodeRanks(docs), err, c.want, c.err)
			}
		})
	}
}

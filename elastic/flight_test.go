package elastic

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"
)

func TestAnalyzeHang(t *testing.T) {
	now := time.Unix(1000, 0)
	at := func(s float64) time.Time { return now.Add(-time.Duration(s * float64(time.Second))) }
	allReduce := func(seq uint64, done bool) flightOp {
		o := flightOp{seq: seq, op: "all_reduce", dtype: "float32", count: 1 << 20, peer: -1, state: flightRunning, start: at(61)}
		if done {
			o.state, o.start, o.end = flightDone, at(62), at(61.2)
		}
		return o
	}
	recv := flightOp{seq: 1043, op: "recv", dtype: "int32", count: 2, peer: 5, state: flightRunning, start: at(61)}
	in1043 := []flightOp{allReduce(1042, true), allReduce(1043, false)}
	for _, c := range []struct {
		name     string
		ranks    []rankFlight
		want     []string
		laggards []int
	}{{
		name:  "one rank stopped calling",
		ranks: []rankFlight{{0, in1043}, {1, in1043}, {2, in1043}, {3, []flightOp{allReduce(1042, true)}}},
		want: []string{
			"ranks 0-2 are in all_reduce #1043 (float32 x 1048576) since 1m1s, waiting for rank 3",
			"rank 3 completed all_reduce #1042 (float32 x 1048576) and is in no operation since 1m1s",
		},
		laggards: []int{3},
	}, {
		name:  "one rank in another operation",
		ranks: []rankFlight{{3, []flightOp{allReduce(1042, true), recv}}, {0, in1043}, {1, in1043}, {2, in1043}},
		want: []string{
			"ranks 0-2 are in all_reduce #1043 (float32 x 1048576) since 1m1s, waiting for rank 3",
			"rank 3 is in recv #1043 (src=5, int32 x 2) since 1m1s",
		},
		laggards: []int{3},
	}, {
		name: "ranks behind, by several",
		ranks: []rankFlight{{0, in1043}, {1, nil}, {2, in1043}, {4, in1043},
			{5, []flightOp{{seq: 9, op: "barrier", peer: -1, state: flightFailed, start: at(3), end: at(2.5)}}}},
		want: []string{
			"ranks 0,2,4 are in all_reduce #1043 (float32 x 1048576) since 1m1s, waiting for ranks 1,5",
			"rank 5 failed barrier #9 and is in no operation since 2.5s",
			"rank 1 recorded no operation",
		},
		laggards: []int{1, 5},
	}, {
		name:  "all in the same operation",
		ranks: []rankFlight{{0, in1043}, {1, in1043}},
		want:  []string{"ranks 0-1 are in all_reduce #1043 (float32 x 1048576) since 1m1s: no rank of this node holds the others up"},
	}, {
		name: "nothing", ranks: nil, want: nil,
	}} {
		lines, laggards := analyzeHang(c.ranks, now)
		if !slices.Equal(lines, c.want) || !slices.Equal(laggards, c.laggards) {
			t.Errorf("%s: got %q, laggards %v\nwant %q, laggards %v", c.name, lines, laggards, c.want, c.laggards)
		}
	}
}

func TestRankList(t *testing.T) {
	for _, c := range []struct {
		ranks []int
		want  string
	}{
		{[]int{3}, "rank 3"},
		{[]int{0, 1, 2, 5, 7, 8}, "ranks 0-2,5,7-8"},
		{[]int{4, 6}, "ranks 4,6"},
	} {
		if got := rankList(c.ranks); got != c.want {
			t.Errorf("rankList(%v) = %q, want %q", c.ranks, got, c.want)
		}
	}
}

func TestDecodeFlight(t *testing.T) {
	b := make([]byte, flightHeader+3*flightSlotSize)
	binary.NativeEndian.PutUint32(b[8:], flightMagic)
	binary.NativeEndian.PutUint32(b[12:], 3)
	put := func(slot int, seq uint64, end int64, op string) {
		base := flightHeader + slot*flightSlotSize
		binary.NativeEndian.PutUint64(b[base:], seq)
		binary.NativeEndian.PutUint64(b[base+8:], 5)
		binary.NativeEndian.PutUint64(b[base+16:], uint64(end))
		binary.NativeEndian.PutUint64(b[base+32:], ^uint64(0)) // -1
		binary.NativeEndian.PutUint64(b[base+40:], flightDone)
		copy(b[base+48:], op)
		copy(b[base+72:], "int64")
	}
	put(0, 4, 0, "recv") // the ring wrapped: 4 replaced 1
	put(2, 3, 9, "all_reduce")
	ops := decodeFlight(b)
	if len(ops) != 2 || ops[0].seq != 3 || ops[0].op != "all_reduce" || ops[0].end != time.Unix(0, 9) ||
		ops[1].seq != 4 || ops[1].op != "recv" || !ops[1].end.IsZero() || ops[1].peer != -1 || ops[1].dtype != "int64" {
		t.Errorf("decoded %+v", ops)
	}
	if ops := decodeFlight(make([]byte, 8)); ops != nil {
		t.Errorf("a bare counter decoded to %+v", ops)
	}
}

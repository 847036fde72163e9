package runtime

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/rendezvous"
)

// readProgress reads the counter as the launcher does: from the file.
func readProgress(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	if len(b) < progressSize {
		return 0, fmt.Errorf("%s holds %d bytes", path, len(b))
	}
	return binary.NativeEndian.Uint64(b), nil
}

func TestProgressCountsCompletedOperations(t *testing.T) {
	const n = 2
	dir := t.TempDir()
	paths := make([]string, n)
	for r := range paths {
		paths[r] = filepath.Join(dir, fmt.Sprint(r))
		// Rank 1's file is empty: the runtime grows it to the counter.
		if err := os.WriteFile(paths[r], make([]byte, progressSize*(1-r)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	counted := func(rank int, want uint64) error {
		got, err := readProgress(paths[rank])
		if err == nil && got != want {
			err = fmt.Errorf("progress counter = %d, want %d", got, want)
		}
		return err
	}
	fake := newFakeNet(n)
	runRanks(t, n, func(pg *ProcessGroup) error {
		ctx, rank := context.Background(), pg.Rank()
		if err := counted(rank, 1); err != nil { // joined
			return fmt.Errorf("after Init: %w", err)
		}
		for range 3 {
			if err := pg.AllReduce(ctx, Of([]float32{1}), Sum); err != nil {
				return err
			}
		}
		// Refused before it runs: a mistake is no progress.
		if err := pg.Broadcast(ctx, Of([]float32{1}), n); err == nil {
			return fmt.Errorf("broadcast from rank %d succeeded", n)
		}
		var err error
		if rank == 0 {
			err = pg.Send(ctx, Of([]int32{7}), 1, 0)
		} else {
			_, err = pg.Recv(ctx, Of([]int32{0}), 0, 0)
		}
		if err != nil {
			return err
		}
		return counted(rank, 5)
	}, func(rank int) []Option {
		connect := func(context.Context, rendezvous.Store) (collective.Comm, error) { return fake.comm(rank), nil }
		return []Option{
			WithStore(rendezvous.NewMemoryStore(0)), withConnector(connect),
			withEnv(map[string]string{ProgressFileEnv: paths[rank]}),
		}
	})
}

func TestProgressFileMissingIsNotFatal(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent", "progress")
	onRanks(t, 1, func(pg *ProcessGroup) error {
		return pg.AllReduce(context.Background(), Of([]float32{1}), Sum)
	}, withEnv(map[string]string{ProgressFileEnv: missing}))
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the runtime created %s: %v", missing, err)
	}
}

// flightOp is a flight recorder's slot, as a test reads it from the file.
type flightOp struct {
	seq, state  uint64
	start, end  int64
	count, peer int64
	op, dtype   string
}

func (o flightOp) String() string {
	return fmt.Sprintf("#%d %s(%s x %d, peer %d) state %d", o.seq, o.op, o.dtype, o.count, o.peer, o.state)
}

// readFlight reads the recorded operations from the file, by sequence
// number.
func readFlight(path string) ([]flightOp, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < progressFileSize || binary.NativeEndian.Uint32(b[8:]) != flightMagic {
		return nil, fmt.Errorf("%s: no flight recorder in %d bytes", path, len(b))
	}
	u := func(off int) uint64 { return binary.NativeEndian.Uint64(b[off:]) }
	name := func(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }
	var ops []flightOp
	for i := range flightSlots {
		base := flightHeader + i*flightSlotSize
		if u(base) == 0 {
			continue
		}
		ops = append(ops, flightOp{
			seq: u(base), start: int64(u(base + 8)), end: int64(u(base + 16)),
			count: int64(u(base + 24)), peer: int64(u(base + 32)), state: u(base + 40),
			op: name(b[base+48 : base+72]), dtype: name(b[base+72 : base+80]),
		})
	}
	slices.SortFunc(ops, func(a, b flightOp) int { return cmp.Compare(a.seq, b.seq) })
	return ops, nil
}

// The flight recorder keeps the last operations, what they were and how
// they ended; a refused call is none, and older operations give way.
func TestFlightRecorderKeepsTheLastOperations(t *testing.T) {
	const n, extra = 2, flightSlots + 5
	dir := t.TempDir()
	paths := make([]string, n)
	for r := range paths {
		paths[r] = filepath.Join(dir, fmt.Sprint(r))
		if err := os.WriteFile(paths[r], make([]byte, progressSize), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fake := newFakeNet(n)
	before := time.Now().UnixNano()
	runRanks(t, n, func(pg *ProcessGroup) error {
		ctx, rank := context.Background(), pg.Rank()
		if err := pg.AllReduce(ctx, Of(make([]float32, 1000)), Sum); err != nil {
			return err
		}
		if err := pg.Broadcast(ctx, Of([]float32{1}), n); err == nil {
			return fmt.Errorf("broadcast from rank %d succeeded", n)
		}
		var err error
		if rank == 0 {
			err = pg.Send(ctx, Of([]int32{7, 8}), 1, 0)
		} else {
			_, err = pg.Recv(ctx, Of([]int32{0, 0}), 0, 0)
		}
		if err != nil {
			return err
		}
		ops, err := readFlight(paths[rank])
		if err != nil {
			return err
		}
		wantPeer := int64(1 - rank)
		wantOp := []string{"send", "recv"}[rank]
		if len(ops) != 2 || ops[0].seq != 1 || ops[0].op != "all_reduce" || ops[0].dtype != "float32" ||
			ops[0].count != 1000 || ops[0].peer != -1 || ops[0].state != flightDone ||
			ops[1].seq != 2 || ops[1].op != wantOp || ops[1].dtype != "int32" || ops[1].count != 2 ||
			ops[1].peer != wantPeer || ops[1].state != flightDone {
			return fmt.Errorf("recorded %v", ops)
		}
		for _, o := range ops {
			if o.start < before || o.end < o.start {
				return fmt.Errorf("%v: times %d..%d, started after %d", o, o.start, o.end, before)
			}
		}
		for range extra {
			if err := pg.Barrier(ctx); err != nil {
				return err
			}
		}
		if ops, err = readFlight(paths[rank]); err != nil {
			return err
		}
		last := uint64(2 + extra)
		if len(ops) != flightSlots || ops[0].seq != last-flightSlots+1 || ops[len(ops)-1].seq != last ||
			ops[len(ops)-1].op != "barrier" || ops[len(ops)-1].dtype != "" {
			return fmt.Errorf("after %d barriers, recorded %d operations, %v .. %v", extra, len(ops), ops[0], ops[len(ops)-1])
		}
		return nil
	}, func(rank int) []Option {
		connect := func(context.Context, rendezvous.Store) (collective.Comm, error) { return fake.comm(rank), nil }
		return []Option{
			WithStore(rendezvous.NewMemoryStore(0)), withConnector(connect),
			withEnv(map[string]string{ProgressFileEnv: paths[rank]}),
		}
	})
}

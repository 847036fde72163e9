package runtime

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

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

// Command elastic is the ddp example made fault tolerant, the way a
// torchrun elastic job is: it checkpoints its progress, and when the
// launcher restarts the worker group (after a failure, or because nodes
// joined or left) it resumes from the last checkpoint, with whatever world
// size the new group has.
//
//	gorun --nproc-per-node 4 --max-restarts 3 bin/elastic -steps 300
//
// Rank 0 owns the checkpoint: it reads it at start and broadcasts the
// step and parameters, so every rank resumes identically even when only
// rank 0 can see the file, and it writes it every -every steps. Across
// nodes, put -checkpoint on storage that whichever node hosts rank 0 can
// read, or a restarted job whose rank 0 moved starts afresh.
//
// The data set is fixed and sharded by rank and world size on every
// start, so a job resumed with a different world size still trains the
// same model on the same data: only the split of the work changes.
//
// -fail-at-step, -fail-rank and -fail-code inject a failure on the first
// attempt only (TORCHELASTIC_RESTART_COUNT 0), so that a restarted group
// gets past the step and tests can see the job recover.
package main

import (
	"context"
	"encoding/gob"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gorun/gorun/examples/internal/logreg"
	dist "github.com/gorun/gorun/runtime"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "elastic:", err)
		dist.RecordError(err) // for the launcher's failure report
		os.Exit(1)
	}
}

func run() error {
	steps := flag.Int("steps", 300, "total optimisation steps, counting those of earlier attempts")
	ckptPath := flag.String("checkpoint", "elastic.ckpt", "checkpoint file, read at start and written by rank 0")
	every := flag.Int("every", 20, "steps between checkpoints")
	stepDelay := flag.Duration("step-delay", 0, "sleep per step, to make the job slow enough to disturb")
	failAt := flag.Int("fail-at-step", 0, "on the first attempt, -fail-rank exits on reaching this step (0: never)")
	failRank := flag.Int("fail-rank", 0, "the rank that -fail-at-step makes fail")
	failCode := flag.Int("fail-code", 1, "the exit code of the injected failure")
	logEvery := flag.Int("log-every", 10, "steps between loss reports")
	features := flag.Int("features", 32, "input features")
	samples := flag.Int("samples", 4096, "training samples in the whole data set")
	lr := flag.Float64("lr", 0.5, "learning rate")
	flag.Parse()
	if *every < 1 || *logEvery < 1 {
		return errors.New("-every and -log-every must be at least 1")
	}

	// The launcher counts restarts of the worker group; torchrun calls it
	// TORCHELASTIC_RESTART_COUNT. Absent means a first attempt.
	restart := 0
	if s := os.Getenv("TORCHELASTIC_RESTART_COUNT"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("TORCHELASTIC_RESTART_COUNT=%q: %w", s, err)
		}
		restart = n
	}

	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	rank, world := pg.Rank(), pg.Size()
	fmt.Printf("rank %d of %d on GROUP_RANK %s (LOCAL_RANK %d)\n",
		rank, world, os.Getenv("GROUP_RANK"), pg.LocalRank())

	start, err := resume(ctx, pg, *ckptPath, *features)
	if err != nil {
		return err
	}
	params := start.Params
	if rank == 0 {
		if start.Step > 0 {
			fmt.Printf("resumed from step %d (checkpoint written by world %d) with world %d\n",
				start.Step, start.World, world)
		} else {
			fmt.Printf("starting fresh with world %d\n", world)
		}
	}

	// Shard after resuming, by this attempt's world size: the data set is
	// the same whatever the world, only who computes which part changes.
	data := logreg.Synthetic(*samples, *features).Shard(rank, world)
	save := func(step int) error {
		return writeCheckpoint(*ckptPath, checkpoint{Step: step, World: world, Params: params})
	}

	grad := make([]float64, len(params)+1) // the gradient, then the loss
	for step := start.Step + 1; step <= *steps; step++ {
		if step == *failAt && rank == *failRank && restart == 0 {
			fmt.Fprintf(os.Stderr, "rank %d: injected failure at step %d, exit code %d\n", rank, step, *failCode)
			os.Exit(*failCode)
		}
		time.Sleep(*stepDelay)
		data.Gradient(params, grad)
		if err := pg.AllReduce(ctx, dist.Of(grad), dist.Avg); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		loss := grad[len(params)]
		for i := range params {
			params[i] -= *lr * grad[i]
		}
		if rank == 0 && (step%*logEvery == 0 || step == start.Step+1) {
			fmt.Printf("step %d loss %.4f world %d restart %d\n", step, loss, world, restart)
		}
		// Every rank has applied the same averaged gradient, so rank 0's
		// parameters are everyone's: its copy alone is the checkpoint.
		if rank == 0 && step%*every == 0 {
			if err := save(step); err != nil {
				return err
			}
		}
	}
	done := max(start.Step, *steps)

	// The proof that every rank resumed and trained identically: they hold
	// bitwise the same parameters.
	digests := make([]int64, world)
	if err := pg.AllGatherInto(ctx, dist.Of(digests), dist.Of([]int64{logreg.Digest(params)})); err != nil {
		return err
	}
	for r, d := range digests {
		if d != digests[0] {
			return fmt.Errorf("rank %d's parameters differ from rank 0's", r)
		}
	}
	// The loss of the final parameters over the whole data set, which also
	// gives a resumed job that had no steps left a loss to report.
	data.Gradient(params, grad)
	if err := pg.AllReduce(ctx, dist.Of(grad), dist.Avg); err != nil {
		return err
	}
	if rank == 0 {
		fmt.Printf("finished %d steps with world %d after %d restarts: loss %.4f\n",
			done, world, restart, grad[len(params)])
		// A job that resumed with no steps left keeps the checkpoint as
		// it was: its parameters are still the writing world's.
		if done > start.Step {
			if err := save(done); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkpoint is what survives a restart: how far training got, the
// parameters, and the world size that wrote it (for the record: resuming
// does not depend on it).
type checkpoint struct {
	Step   int
	World  int
	Params []float64
}

// startState is what rank 0 broadcasts at start. Err carries rank 0's
// failure to read the checkpoint, so that every rank fails with it instead
// of waiting for parameters that never come.
type startState struct {
	Ckpt checkpoint
	Err  string
}

// resume returns the state every rank starts from: rank 0's checkpoint if
// it has one, fresh parameters otherwise.
func resume(ctx context.Context, pg *dist.ProcessGroup, path string, features int) (checkpoint, error) {
	var st startState
	if pg.Rank() == 0 {
		// A worker killed while writing leaves its temporary file behind;
		// the checkpoint itself is whole, so the leftovers can go.
		stale, _ := filepath.Glob(path + ".tmp*")
		for _, name := range stale {
			os.Remove(name)
		}
		c, err := readCheckpoint(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			c = checkpoint{Params: freshParams(features)}
		case err != nil:
			st.Err = err.Error()
		case len(c.Params) != features+1:
			st.Err = fmt.Sprintf("checkpoint %s has %d parameters; -features %d needs %d",
				path, len(c.Params), features, features+1)
		}
		st.Ckpt = c
	}
	if err := dist.BroadcastObject(ctx, pg, &st, 0); err != nil {
		return checkpoint{}, err
	}
	if st.Err != "" {
		// Rank 0 exiting at once can cut the broadcast off before a peer
		// has it; the barrier holds every rank until all know the cause.
		pg.Barrier(ctx)
		return checkpoint{}, fmt.Errorf("rank 0: %s", st.Err)
	}
	return st.Ckpt, nil
}

// freshParams are the initial parameters: small, and the same on every
// start, so a job begun afresh is reproducible.
func freshParams(features int) []float64 {
	init := rand.New(rand.NewPCG(7, 7))
	params := make([]float64, features+1)
	for i := range params {
		params[i] = init.NormFloat64() * 0.01
	}
	return params
}

func readCheckpoint(path string) (checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return checkpoint{}, err
	}
	defer f.Close()
	var c checkpoint
	if err := gob.NewDecoder(f).Decode(&c); err != nil {
		return checkpoint{}, fmt.Errorf("read checkpoint %s: %w", path, err)
	}
	return c, nil
}

// writeCheckpoint replaces the checkpoint atomically: a worker killed
// mid-write (the very failure a checkpoint is for) leaves the previous
// checkpoint whole rather than a truncated one. The temporary file lives
// in the same directory so that the rename cannot cross file systems.
func writeCheckpoint(path string, c checkpoint) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			err = fmt.Errorf("write checkpoint %s: %w", path, err)
		}
	}()
	// CreateTemp makes the file private; a checkpoint is ordinary output,
	// readable like any other file the job writes.
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := gob.NewEncoder(f).Encode(c); err != nil {
		return err
	}
	// The data must be on disk before the rename makes it the checkpoint,
	// or a crash could leave the new name pointing at an empty file.
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	// Syncing the directory makes the rename itself durable. Some file
	// systems cannot sync a directory; the checkpoint is still whole there.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

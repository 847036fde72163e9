// Command hang is a worker that hangs on purpose, to show and test
// gorun's hang detection:
//
//	gorun --nproc-per-node 2 --hang-timeout 2s bin/hang -hang-after 5
//
// Every rank runs -steps all_reduces; after -hang-after of them, rank
// -hang-rank stops calling collectives and sleeps, so the other ranks wait
// in the next all_reduce: the whole group makes no progress, and gorun
// dumps the stuck workers' stacks and restarts the group. With -first-only
// the hang happens on the first attempt only (TORCHELASTIC_RESTART_COUNT
// 0), so a restarted group completes.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	dist "github.com/gorun/gorun/runtime"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "hang:", err)
		dist.RecordError(err) // for the launcher's failure report
		os.Exit(1)
	}
}

func run() error {
	steps := flag.Int("steps", 20, "all_reduces to run")
	hangAfter := flag.Int("hang-after", 5, "all_reduces before -hang-rank hangs (0: never)")
	hangRank := flag.Int("hang-rank", 1, "the rank that hangs")
	firstOnly := flag.Bool("first-only", false, "hang on the first attempt only")
	exit := flag.Bool("exit", false, "-hang-rank exits 3 where it would hang")
	flag.Parse()

	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	rank := pg.Rank()
	hangs := *hangAfter > 0 && rank == *hangRank &&
		(!*firstOnly || os.Getenv("TORCHELASTIC_RESTART_COUNT") == "0")
	sum := []float64{0}
	for step := 1; step <= *steps; step++ {
		if hangs && step > *hangAfter && *exit {
			fmt.Printf("rank %d: exiting after %d all_reduces\n", rank, *hangAfter)
			os.Exit(3)
		}
		if hangs && step > *hangAfter {
			fmt.Printf("rank %d: hanging after %d all_reduces\n", rank, *hangAfter)
			time.Sleep(time.Hour)
		}
		sum[0] = 1
		if err := pg.AllReduce(ctx, dist.Of(sum), dist.Sum); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
	}
	if rank == 0 {
		fmt.Printf("done: %d all_reduces of world %d\n", *steps, pg.Size())
	}
	return nil
}

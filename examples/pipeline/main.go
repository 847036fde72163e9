// Command pipeline runs a two-stage pipeline over point-to-point messages:
// even ranks are stage 0, odd ranks stage 1, and each pair streams
// micro-batches through both stages and back, overlapping communication
// with computation through isend/irecv, as pipeline parallelism does.
//
//	gorun --nproc-per-node 2 bin/pipeline -microbatches 64
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
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		dist.RecordError(err) // for the launcher's failure report
		os.Exit(1)
	}
}

func run() error {
	microbatches := flag.Int("microbatches", 64, "micro-batches per pair of stages")
	width := flag.Int("width", 4096, "float32 values per micro-batch")
	flag.Parse()

	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	if pg.Size()%2 != 0 {
		return fmt.Errorf("needs an even number of ranks, got %d", pg.Size())
	}
	start := time.Now()
	if pg.Rank()%2 == 0 {
		err = firstStage(ctx, pg, pg.Rank()+1, *microbatches, *width)
	} else {
		err = secondStage(ctx, pg, pg.Rank()-1, *microbatches, *width)
	}
	if err != nil {
		return err
	}
	if err := pg.Barrier(ctx); err != nil {
		return err
	}
	if pg.Rank() == 0 {
		fmt.Printf("%d pairs streamed %d micro-batches of %d values through 2 stages in %s\n",
			pg.Size()/2, *microbatches, *width, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// Stage functions: stage 0 computes 2x+1, stage 1 squares.
func stage0(x float32) float32 { return 2*x + 1 }
func stage1(y float32) float32 { return y * y }

// input is micro-batch m's i-th value.
func input(m, i int) float32 { return float32((m+i)%11) - 5 }

// firstStage sends every micro-batch forward as soon as it is computed,
// posts all receives for the results up front, and checks every result.
func firstStage(ctx context.Context, pg *dist.ProcessGroup, next, microbatches, width int) error {
	results := make([][]float32, microbatches)
	var pending []*dist.Work
	for m := range results {
		results[m] = make([]float32, width)
		pending = append(pending, pg.IRecv(dist.Of(results[m]), next, resultTag(m)))
	}
	for m := 0; m < microbatches; m++ {
		out := make([]float32, width)
		for i := range out {
			out[i] = stage0(input(m, i))
		}
		pending = append(pending, pg.ISend(dist.Of(out), next, forwardTag(m)))
	}
	for _, w := range pending {
		if err := w.Wait(ctx); err != nil {
			return err
		}
	}
	for m, got := range results {
		for i, v := range got {
			if want := stage1(stage0(input(m, i))); v != want {
				return fmt.Errorf("micro-batch %d value %d: got %g, want %g", m, i, v, want)
			}
		}
	}
	fmt.Printf("stage 0 (rank %d): all %d results from rank %d are right\n", pg.Rank(), microbatches, next)
	return nil
}

// secondStage receives micro-batches in order, computes, and sends each
// result back while the next one is already arriving.
func secondStage(ctx context.Context, pg *dist.ProcessGroup, prev, microbatches, width int) error {
	in := [2][]float32{make([]float32, width), make([]float32, width)}
	recv := pg.IRecv(dist.Of(in[0]), prev, forwardTag(0))
	var sends []*dist.Work
	for m := 0; m < microbatches; m++ {
		if err := recv.Wait(ctx); err != nil {
			return err
		}
		cur := in[m%2]
		if m+1 < microbatches {
			recv = pg.IRecv(dist.Of(in[(m+1)%2]), prev, forwardTag(m+1))
		}
		out := make([]float32, width)
		for i, v := range cur {
			out[i] = stage1(v)
		}
		sends = append(sends, pg.ISend(dist.Of(out), prev, resultTag(m)))
	}
	for _, w := range sends {
		if err := w.Wait(ctx); err != nil {
			return err
		}
	}
	fmt.Printf("stage 1 (rank %d): processed %d micro-batches from rank %d\n", pg.Rank(), microbatches, prev)
	return nil
}

// Forward activations and returned results travel under distinct tags.
func forwardTag(m int) int { return 2 * m }
func resultTag(m int) int  { return 2*m + 1 }

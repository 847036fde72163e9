// Command ddp trains a logistic-regression model data-parallel, the way
// PyTorch's DistributedDataParallel does: every rank computes gradients on
// its own shard of the data, the gradients are averaged with all_reduce, and
// every rank applies the same update, so the parameters stay identical.
//
//	gorun --nproc-per-node 4 bin/ddp -steps 200
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/gorun/gorun/examples/internal/logreg"
	dist "github.com/gorun/gorun/runtime"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ddp:", err)
		dist.RecordError(err) // for the launcher's failure report
		os.Exit(1)
	}
}

func run() error {
	steps := flag.Int("steps", 200, "training steps")
	features := flag.Int("features", 32, "input features")
	samples := flag.Int("samples", 4096, "training samples in the whole data set")
	lr := flag.Float64("lr", 0.5, "learning rate")
	every := flag.Int("log-every", 50, "steps between loss reports")
	flag.Parse()

	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		return err
	}
	defer pg.Close()
	rank, world := pg.Rank(), pg.Size()

	data := logreg.Synthetic(*samples, *features).Shard(rank, world)
	// Every rank starts from rank 0's initial parameters, as DDP
	// broadcasts them at construction.
	params := make([]float64, *features+1)
	if rank == 0 {
		init := rand.New(rand.NewPCG(7, 7))
		for i := range params {
			params[i] = init.NormFloat64() * 0.01
		}
	}
	if err := pg.Broadcast(ctx, dist.Of(params), 0); err != nil {
		return err
	}

	grad := make([]float64, len(params)+1) // the gradient, then the loss
	for step := 1; step <= *steps; step++ {
		data.Gradient(params, grad)
		if err := pg.AllReduce(ctx, dist.Of(grad), dist.Avg); err != nil {
			return err
		}
		loss := grad[len(params)]
		for i := range params {
			params[i] -= *lr * grad[i]
		}
		if rank == 0 && (step == 1 || step%*every == 0 || step == *steps) {
			fmt.Printf("step %4d  loss %.4f\n", step, loss)
		}
	}

	// The proof that data parallelism worked: every rank holds bitwise the
	// same parameters.
	digests := make([]int64, world)
	if err := pg.AllGatherInto(ctx, dist.Of(digests), dist.Of([]int64{logreg.Digest(params)})); err != nil {
		return err
	}
	for r, d := range digests {
		if d != digests[0] {
			return fmt.Errorf("rank %d's parameters differ from rank 0's", r)
		}
	}
	if rank == 0 {
		fmt.Printf("parameters identical on all %d ranks (digest %016x), accuracy %.1f%%\n",
			world, uint64(digests[0]), 100*data.Accuracy(params))
	}
	return nil
}

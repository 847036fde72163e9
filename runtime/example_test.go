package runtime_test

import (
	"context"
	"fmt"
	"log"

	dist "github.com/gorun/gorun/runtime"
)

// A data-parallel step: every rank averages its gradients with the
// others'. Run the program under gorun or torchrun:
//
//	gorun --nproc-per-node 4 ./train
func Example() {
	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()

	grads := []float32{0.1, 0.2, 0.3}
	if err := pg.AllReduce(ctx, dist.Of(grads), dist.Avg); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("rank %d of %d: averaged gradients %v\n", pg.Rank(), pg.Size(), grads)
}

// Overlap communication with computation: start the all-reduce of one
// bucket, work on the next, then wait.
func ExampleProcessGroup_AllReduceAsync() {
	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()

	bucket := make([]float32, 1<<20)
	work := pg.AllReduceAsync(dist.Of(bucket), dist.Sum)
	// ... compute the next bucket; leave this one alone ...
	if err := work.Wait(ctx); err != nil {
		log.Fatal(err)
	}
}

// Two-dimensional parallelism on 8 ranks: tensor parallelism within each
// half, data parallelism across.
func ExampleNewDeviceMesh() {
	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()

	mesh, err := dist.NewDeviceMesh(ctx, pg, []int{2, 4}, []string{"dp", "tp"})
	if err != nil {
		log.Fatal(err)
	}
	activations := make([]float32, 1024)
	if err := mesh.Group("tp").AllReduce(ctx, dist.Of(activations), dist.Sum); err != nil {
		log.Fatal(err)
	}
	fmt.Println("data-parallel replica", mesh.LocalRank("dp"))
}

// Share a Go value chosen by rank 0.
func ExampleBroadcastObject() {
	ctx := context.Background()
	pg, err := dist.Init(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()

	type config struct {
		Seed   int64
		Shards []string
	}
	var cfg config
	if pg.Rank() == 0 {
		cfg = config{Seed: 42, Shards: []string{"a", "b"}}
	}
	if err := dist.BroadcastObject(ctx, pg, &cfg, 0); err != nil {
		log.Fatal(err)
	}
}

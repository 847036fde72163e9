package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorun/gorun/rendezvous"
	dist "github.com/gorun/gorun/runtime"
)

// A data-parallel step: every rank averages its gradients with the
// others'. A worker program is one rank; run it under gorun or torchrun,
// and Init reads the variables they give it:
//
//	gorun --nproc-per-node 4 ./train
//
// Here launch plays the launcher: it serves a store on the loopback
// interface and runs four ranks as goroutines of this process, each with
// its own variables, which Init reads through WithLookupEnv instead of the
// process's environment; it prints what each rank wrote to out, in rank
// order. The other examples run their ranks the same way, through
// onRanks, which hands each rank the group Init returned.
func Example() {
	launch(4, func(ctx context.Context, lookupEnv func(string) (string, bool), out io.Writer) error {
		pg, err := dist.Init(ctx, dist.WithLookupEnv(lookupEnv)) // in a program: dist.Init(ctx)
		if err != nil {
			return err
		}
		defer pg.Close()

		grads := []float32{float32(pg.Rank()), 1, 2}
		if err := pg.AllReduce(ctx, dist.Of(grads), dist.Avg); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d of %d: averaged gradients %v\n", pg.Rank(), pg.Size(), grads)
		return nil
	})
	// Output:
	// rank 0 of 4: averaged gradients [1.5 1 2]
	// rank 1 of 4: averaged gradients [1.5 1 2]
	// rank 2 of 4: averaged gradients [1.5 1 2]
	// rank 3 of 4: averaged gradients [1.5 1 2]
}

// Init reads the variables gorun and torchrun give each worker: here a
// world of one rank, whose variables come from a map, meeting through a
// store this process serves on the loopback interface, as the launcher's
// store is served (TORCHELASTIC_USE_AGENT_STORE=True). Without that
// variable, rank 0 would host the store on MASTER_PORT itself.
func ExampleInit() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	store := rendezvous.NewServer(rendezvous.ServerOptions{})
	go store.Serve(l)
	defer store.Close()

	env := map[string]string{
		"RANK": "0", "WORLD_SIZE": "1",
		"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(l.Addr().(*net.TCPAddr).Port),
		"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
		"GORUN_BACKEND": "tcp",
	}
	lookupEnv := func(name string) (string, bool) { v, ok := env[name]; return v, ok }

	ctx := context.Background()
	pg, err := dist.Init(ctx, dist.WithLookupEnv(lookupEnv), dist.WithTimeout(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	defer pg.Close()
	fmt.Printf("rank %d of %d, local rank %d of %d, backend %s\n",
		pg.Rank(), pg.Size(), pg.LocalRank(), pg.LocalWorldSize(), pg.Backend())
	// Output: rank 0 of 1, local rank 0 of 1, backend tcp
}

// Every rank ends with the same reduction of every rank's tensor.
func ExampleProcessGroup_AllReduce() {
	onRanks(4, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		votes := []int64{int64(pg.Rank()), 1}
		if err := pg.AllReduce(ctx, dist.Of(votes), dist.Sum); err != nil {
			return err
		}
		highest := []int64{int64(10 * pg.Rank())}
		if err := pg.AllReduce(ctx, dist.Of(highest), dist.Max); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: sum %v, max %v\n", pg.Rank(), votes, highest)
		return nil
	})
	// Output:
	// rank 0: sum [6 4], max [30]
	// rank 1: sum [6 4], max [30]
	// rank 2: sum [6 4], max [30]
	// rank 3: sum [6 4], max [30]
}

// Rank 0's initial weights, copied to every rank.
func ExampleProcessGroup_Broadcast() {
	onRanks(3, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		weights := make([]float64, 3)
		if pg.Rank() == 0 {
			weights = []float64{0.5, -1, 2}
		}
		if err := pg.Broadcast(ctx, dist.Of(weights), 0); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: %v\n", pg.Rank(), weights)
		return nil
	})
	// Output:
	// rank 0: [0.5 -1 2]
	// rank 1: [0.5 -1 2]
	// rank 2: [0.5 -1 2]
}

// Every rank gets every rank's tensor, in rank order.
func ExampleProcessGroup_AllGather() {
	onRanks(3, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		mine := []int32{int32(pg.Rank()), int32(pg.Rank() * pg.Rank())}
		all := make([][]int32, pg.Size())
		views := make([]dist.Tensor, pg.Size())
		for i := range all {
			all[i] = make([]int32, len(mine))
			views[i] = dist.Of(all[i])
		}
		if err := pg.AllGather(ctx, views, dist.Of(mine)); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: %v\n", pg.Rank(), all)
		return nil
	})
	// Output:
	// rank 0: [[0 0] [1 1] [2 4]]
	// rank 1: [[0 0] [1 1] [2 4]]
	// rank 2: [[0 0] [1 1] [2 4]]
}

// Each rank holds one tensor per rank; rank i ends with the sum of every
// rank's i-th tensor: an all-reduce whose result is left in shards.
func ExampleProcessGroup_ReduceScatter() {
	onRanks(3, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		in := make([]dist.Tensor, pg.Size())
		for i := range in {
			in[i] = dist.Of([]float32{float32(10*i + pg.Rank())})
		}
		shard := make([]float32, 1)
		if err := pg.ReduceScatter(ctx, dist.Of(shard), in, dist.Sum); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: %v\n", pg.Rank(), shard)
		return nil
	})
	// Output:
	// rank 0: [3]
	// rank 1: [33]
	// rank 2: [63]
}

// Rank r sends its i-th tensor to rank i, and receives rank i's r-th
// tensor into its own i-th: a transpose, as when experts exchange tokens.
func ExampleProcessGroup_AllToAll() {
	onRanks(3, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		in := make([]dist.Tensor, pg.Size())
		got := make([][]int64, pg.Size())
		received := make([]dist.Tensor, pg.Size())
		for i := range in {
			in[i] = dist.Of([]int64{int64(10*pg.Rank() + i)})
			got[i] = make([]int64, 1)
			received[i] = dist.Of(got[i])
		}
		if err := pg.AllToAll(ctx, received, in); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: %v\n", pg.Rank(), got)
		return nil
	})
	// Output:
	// rank 0: [[0] [10] [20]]
	// rank 1: [[1] [11] [21]]
	// rank 2: [[2] [12] [22]]
}

// No rank leaves the barrier before every rank has entered it. (The ranks
// here are goroutines of one process, so they can count their arrivals in
// one variable.)
func ExampleProcessGroup_Barrier() {
	var arrived atomic.Int32
	onRanks(4, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		arrived.Add(1)
		if err := pg.Barrier(ctx); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d saw %d ranks arrive\n", pg.Rank(), arrived.Load())
		return nil
	})
	// Output:
	// rank 0 saw 4 ranks arrive
	// rank 1 saw 4 ranks arrive
	// rank 2 saw 4 ranks arrive
	// rank 3 saw 4 ranks arrive
}

// A message from one rank to another, matched by tag; Recv also takes
// dist.AnySource and returns who sent.
func ExampleProcessGroup_Send() {
	onRanks(3, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		const tag = 7
		if pg.Rank() != 0 {
			return pg.Send(ctx, dist.Of([]int32{int32(100 * pg.Rank())}), 0, tag)
		}
		for range pg.Size() - 1 {
			msg := make([]int32, 1)
			from, err := pg.Recv(ctx, dist.Of(msg), dist.AnySource, tag)
			if err != nil {
				return err
			}
			if msg[0] != int32(100*from) {
				return fmt.Errorf("rank %d sent %v", from, msg)
			}
		}
		fmt.Fprintln(out, "rank 0 heard from every other rank")
		return nil
	})
	// Output: rank 0 heard from every other rank
}

// Overlap communication with computation: start the all-reduce of one
// bucket, work on the next, then wait for the first.
func ExampleProcessGroup_AllReduceAsync() {
	onRanks(2, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		bucket := []float32{1, 2, 3}
		work := pg.AllReduceAsync(dist.Of(bucket), dist.Sum)
		// ... compute the next bucket; leave this one alone ...
		next := []float32{float32(pg.Rank())}
		if err := work.Wait(ctx); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: reduced %v, next %v\n", pg.Rank(), bucket, next)
		return nil
	})
	// Output:
	// rank 0: reduced [2 4 6], next [0]
	// rank 1: reduced [2 4 6], next [1]
}

// A group of some of the ranks. Every rank calls NewGroup; the others get
// a group they are not a member of.
func ExampleProcessGroup_NewGroup() {
	onRanks(4, func(ctx context.Context, world *dist.ProcessGroup, out io.Writer) error {
		trio, err := world.NewGroup(ctx, []int{0, 2, 3})
		if err != nil {
			return err
		}
		if !trio.IsMember() {
			fmt.Fprintf(out, "rank %d: not a member\n", world.Rank())
			return nil
		}
		sum := []int64{int64(world.Rank())}
		if err := trio.AllReduce(ctx, dist.Of(sum), dist.Sum); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: rank %d of %d in the group, sum of members %v\n",
			world.Rank(), trio.Rank(), trio.Size(), sum)
		return nil
	})
	// Output:
	// rank 0: rank 0 of 3 in the group, sum of members [5]
	// rank 1: not a member
	// rank 2: rank 1 of 3 in the group, sum of members [5]
	// rank 3: rank 2 of 3 in the group, sum of members [5]
}

// Two-dimensional parallelism on 4 ranks: tensor parallelism within each
// pair, data parallelism across the pairs.
func ExampleNewDeviceMesh() {
	onRanks(4, func(ctx context.Context, world *dist.ProcessGroup, out io.Writer) error {
		mesh, err := dist.NewDeviceMesh(ctx, world, []int{2, 2}, []string{"dp", "tp"})
		if err != nil {
			return err
		}
		activations := []int64{int64(world.Rank())}
		if err := mesh.Group("tp").AllReduce(ctx, dist.Of(activations), dist.Sum); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: replica %d, shard %d, tp sum %v\n",
			world.Rank(), mesh.LocalRank("dp"), mesh.LocalRank("tp"), activations)
		return nil
	})
	// Output:
	// rank 0: replica 0, shard 0, tp sum [1]
	// rank 1: replica 0, shard 1, tp sum [1]
	// rank 2: replica 1, shard 0, tp sum [5]
	// rank 3: replica 1, shard 1, tp sum [5]
}

// Share a Go value chosen by rank 0.
func ExampleBroadcastObject() {
	type config struct {
		Seed   int64
		Shards []string
	}
	onRanks(3, func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error {
		var cfg config
		if pg.Rank() == 0 {
			cfg = config{Seed: 42, Shards: []string{"a", "b"}}
		}
		if err := dist.BroadcastObject(ctx, pg, &cfg, 0); err != nil {
			return err
		}
		fmt.Fprintf(out, "rank %d: %+v\n", pg.Rank(), cfg)
		return nil
	})
	// Output:
	// rank 0: {Seed:42 Shards:[a b]}
	// rank 1: {Seed:42 Shards:[a b]}
	// rank 2: {Seed:42 Shards:[a b]}
}

// onRanks runs worker on n ranks, as launch does, each given the group of
// every rank from Init.
func onRanks(n int, worker func(ctx context.Context, pg *dist.ProcessGroup, out io.Writer) error) {
	launch(n, func(ctx context.Context, lookupEnv func(string) (string, bool), out io.Writer) error {
		pg, err := dist.Init(ctx, dist.WithLookupEnv(lookupEnv))
		if err != nil {
			return err
		}
		return errors.Join(worker(ctx, pg, out), pg.Close())
	})
}

// launch plays gorun --nproc-per-node n for the examples: it serves a
// store on the loopback interface, runs worker as n ranks, each a
// goroutine with the variables a launcher gives its workers, then prints
// what each rank wrote to out, in rank order, or its error.
func launch(n int, worker func(ctx context.Context, lookupEnv func(string) (string, bool), out io.Writer) error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	store := rendezvous.NewServer(rendezvous.ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- store.Serve(l) }()
	defer func() { store.Close(); <-served }()

	// A hang fails the example in a minute rather than the test binary in
	// ten.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	outs := make([]bytes.Buffer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank := range n {
		env := map[string]string{
			"RANK": strconv.Itoa(rank), "WORLD_SIZE": strconv.Itoa(n),
			"LOCAL_RANK": strconv.Itoa(rank), "LOCAL_WORLD_SIZE": strconv.Itoa(n),
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(l.Addr().(*net.TCPAddr).Port),
			"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
			"GORUN_BACKEND": "tcp", // the same output on a machine with GPUs
		}
		lookupEnv := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
		wg.Go(func() { errs[rank] = worker(ctx, lookupEnv, &outs[rank]) })
	}
	wg.Wait()
	for rank := range n {
		os.Stdout.Write(outs[rank].Bytes())
		if errs[rank] != nil {
			fmt.Printf("rank %d: %v\n", rank, errs[rank])
		}
	}
}

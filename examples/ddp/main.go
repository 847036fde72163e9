// Command ddp trains a logistic-regression model data-parallel, the way
// PyTorch's DistributedDataParallel does: every rank computes gradients on
// its own shard of the data, the gradients are averaged with all_reduce, and
// every rank applies the same update, so the parameters stay identical.
//
//	gorun --nproc-per-node 4 bin/ddp -steps 200
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"

	dist "github.com/gorun/gorun/runtime"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ddp:", err)
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

	data := syntheticData(*samples, *features).shard(rank, world)
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
		data.gradient(params, grad)
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
	if err := pg.AllGatherInto(ctx, dist.Of(digests), dist.Of([]int64{digest(params)})); err != nil {
		return err
	}
	for r, d := range digests {
		if d != digests[0] {
			return fmt.Errorf("rank %d's parameters differ from rank 0's", r)
		}
	}
	if rank == 0 {
		fmt.Printf("parameters identical on all %d ranks (digest %016x), accuracy %.1f%%\n",
			world, digests[0], 100*data.accuracy(params))
	}
	return nil
}

// dataset is a shard of labelled samples: x has features values per sample.
type dataset struct {
	x        []float64
	y        []float64
	features int
}

// syntheticData draws the same data set on every rank: points labelled by
// a hidden hyperplane, with some label noise.
func syntheticData(samples, features int) dataset {
	r := rand.New(rand.NewPCG(42, 42))
	truth := make([]float64, features)
	for i := range truth {
		truth[i] = r.NormFloat64()
	}
	d := dataset{x: make([]float64, samples*features), y: make([]float64, samples), features: features}
	for s := 0; s < samples; s++ {
		dot := 0.0
		for f := 0; f < features; f++ {
			v := r.NormFloat64()
			d.x[s*features+f] = v
			dot += v * truth[f]
		}
		if dot+0.3*r.NormFloat64() > 0 {
			d.y[s] = 1
		}
	}
	return d
}

// shard keeps every world-th sample, starting at rank, as
// DistributedSampler does.
func (d dataset) shard(rank, world int) dataset {
	s := dataset{features: d.features}
	for i := rank; i < len(d.y); i += world {
		s.x = append(s.x, d.x[i*d.features:(i+1)*d.features]...)
		s.y = append(s.y, d.y[i])
	}
	return s
}

// gradient writes the mean log-loss gradient over the shard into grad
// (weights, then bias) followed by the mean loss itself.
func (d dataset) gradient(params, grad []float64) {
	clear(grad)
	n := len(d.y)
	bias := len(params) - 1
	for s := 0; s < n; s++ {
		p := sigmoid(d.logit(params, s))
		diff := p - d.y[s]
		for f := 0; f < d.features; f++ {
			grad[f] += diff * d.x[s*d.features+f]
		}
		grad[bias] += diff
		grad[len(params)] -= d.y[s]*math.Log(p+1e-12) + (1-d.y[s])*math.Log(1-p+1e-12)
	}
	for i := range grad {
		grad[i] /= float64(n)
	}
}

func (d dataset) logit(params []float64, s int) float64 {
	z := params[len(params)-1]
	for f := 0; f < d.features; f++ {
		z += params[f] * d.x[s*d.features+f]
	}
	return z
}

func (d dataset) accuracy(params []float64) float64 {
	right := 0
	for s := range d.y {
		if (d.logit(params, s) > 0) == (d.y[s] == 1) {
			right++
		}
	}
	return float64(right) / float64(len(d.y))
}

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

// digest hashes the parameters' exact bits.
func digest(params []float64) int64 {
	h := fnv.New64a()
	var buf []byte
	for _, p := range params {
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(p))
	}
	h.Write(buf)
	return int64(h.Sum64())
}

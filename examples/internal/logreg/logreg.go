// Package logreg is the model the training examples share: logistic
// regression on a synthetic data set that every rank draws identically,
// sharded as torch's DistributedSampler shards.
package logreg

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// Dataset is a shard of labelled samples: x has features values per sample.
type Dataset struct {
	x        []float64
	y        []float64
	features int
}

// Synthetic draws the same data set on every rank: points labelled by
// a hidden hyperplane, with some label noise.
func Synthetic(samples, features int) Dataset {
	r := rand.New(rand.NewPCG(42, 42))
	truth := make([]float64, features)
	for i := range truth {
		truth[i] = r.NormFloat64()
	}
	d := Dataset{x: make([]float64, samples*features), y: make([]float64, samples), features: features}
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

// Shard keeps every world-th sample, starting at rank, as
// DistributedSampler does.
func (d Dataset) Shard(rank, world int) Dataset {
	s := Dataset{features: d.features}
	for i := rank; i < len(d.y); i += world {
		s.x = append(s.x, d.x[i*d.features:(i+1)*d.features]...)
		s.y = append(s.y, d.y[i])
	}
	return s
}

// Gradient writes the mean log-loss gradient over the shard into grad
// (weights, then bias) followed by the mean loss itself.
func (d Dataset) Gradient(params, grad []float64) {
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

func (d Dataset) logit(params []float64, s int) float64 {
	z := params[len(params)-1]
	for f := 0; f < d.features; f++ {
		z += params[f] * d.x[s*d.features+f]
	}
	return z
}

// Accuracy is the share of samples the parameters classify right.
func (d Dataset) Accuracy(params []float64) float64 {
	right := 0
	for s := range d.y {
		if (d.logit(params, s) > 0) == (d.y[s] == 1) {
			right++
		}
	}
	return float64(right) / float64(len(d.y))
}

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

// Digest hashes the parameters' exact bits.
func Digest(params []float64) int64 {
	h := fnv.New64a()
	var buf []byte
	for _, p := range params {
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(p))
	}
	h.Write(buf)
	return int64(h.Sum64())
}

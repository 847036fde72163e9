// Package collective holds the collective algorithms, the reduction
// kernels per data type (vector instructions where the CPU has them), and
// the transports that carry them: shared memory between the ranks of one
// host, TCP (or Unix sockets) for any. The runtime package builds
// torch.distributed's API on the Comm interface defined here; the NCCL
// backend implements the same interface.
package collective

import (
	"context"

	"github.com/gorun/gorun/collective/elem"
)

// DType is an element type of a buffer (elem.DType).
type DType = elem.DType

// The element types, numbered as NCCL numbers them where it has them.
const (
	Int8     = elem.Int8
	Uint8    = elem.Uint8
	Int32    = elem.Int32
	Int64    = elem.Int64
	Float16  = elem.Float16
	Float32  = elem.Float32
	Float64  = elem.Float64
	BFloat16 = elem.BFloat16
)

// Op is a reduction operator (elem.Op).
type Op = elem.Op

// The reduction operators, numbered as NCCL numbers the ones it has.
const (
	Sum     = elem.Sum
	Product = elem.Product
	Max     = elem.Max
	Min     = elem.Min
	Avg     = elem.Avg  // float types only
	BAnd    = elem.BAnd // integer types only
	BOr     = elem.BOr  // integer types only
	BXor    = elem.BXor // integer types only
)

// AnySource lets Recv accept a message from whichever peer sends first.
const AnySource = -1

// Comm is a communicator: the ranks of one process group and the
// operations among them. Buffers are raw bytes holding elements of the
// given DType; counts are in elements. Every rank of the communicator must
// call the same collectives in the same order with matching shapes; a
// mismatch is an error on every rank involved, never a hang or corrupt
// data. Calls on one Comm are executed one at a time in the order they were
// made (the runtime queues asynchronous ones); Send and Recv with distinct
// tags or peers may overlap with each other but not with collectives.
//
// A blocked call returns when ctx is done, with an error naming the peers
// it was still waiting for; a peer's death fails the pending calls that
// depend on it at once. All ranks are ranks within the communicator.
type Comm interface {
	Rank() int
	Size() int

	// AllReduce reduces buf across all ranks, in place, bitwise identical
	// on every rank.
	AllReduce(ctx context.Context, buf []byte, dt DType, op Op) error
	// Broadcast copies root's buf into every rank's buf.
	Broadcast(ctx context.Context, buf []byte, dt DType, root int) error
	// Reduce reduces buf across all ranks into root's buf; other ranks'
	// buffers are left unspecified.
	Reduce(ctx context.Context, buf []byte, dt DType, op Op, root int) error
	// AllGather concatenates every rank's in into out, in rank order;
	// len(out) == Size()*len(in).
	AllGather(ctx context.Context, out, in []byte, dt DType) error
	// Gather is AllGather whose result only root receives (out is ignored
	// on other ranks).
	Gather(ctx context.Context, out, in []byte, dt DType, root int) error
	// Scatter gives rank i the i-th len(out)-sized slice of root's in.
	Scatter(ctx context.Context, out, in []byte, dt DType, root int) error
	// ReduceScatter reduces in across ranks and leaves the i-th slice of
	// the result on rank i; counts[i] is that slice's element count and
	// len(in) is their sum (times the element size).
	ReduceScatter(ctx context.Context, out, in []byte, dt DType, op Op, counts []int) error
	// AllToAll sends the i-th slice of in (sendCounts[i] elements) to rank
	// i and receives rank i's slice for us into the i-th slice of out
	// (recvCounts[i] elements). Like ReduceScatter, it keeps no count list
	// once it returns: callers reuse theirs.
	AllToAll(ctx context.Context, out, in []byte, dt DType, sendCounts, recvCounts []int) error
	// Barrier returns once every rank has entered it.
	Barrier(ctx context.Context) error

	// Send delivers buf to peer; it matches the peer's Recv with the same tag.
	Send(ctx context.Context, buf []byte, dt DType, peer int, tag int) error
	// Recv fills buf from peer (or AnySource) and returns the sender.
	Recv(ctx context.Context, buf []byte, dt DType, peer int, tag int) (int, error)

	// Split creates a communicator of the ranks listed (in that order; the
	// new rank of ranks[i] is i). Every rank of this communicator calls it
	// with the same list; ranks not listed get (nil, nil). id must be the
	// same on every rank and unique among this communicator's splits.
	Split(ctx context.Context, ranks []int, id string) (Comm, error)

	// Close releases the communicator; pending calls fail.
	Close() error
}

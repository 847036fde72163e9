// Package runtime is the library a worker program calls to take part in a
// distributed job: torch.distributed for Go. Under gorun or torchrun, Init
// reads the launcher's environment and returns the group of every rank,
// whose methods are the collectives (AllReduce, Broadcast, AllGather,
// ReduceScatter, AllToAll, ...), point-to-point messages (Send, Recv,
// BatchISendIRecv) and barriers; NewGroup, Split and NewDeviceMesh make
// smaller groups. Worker programs import it as dist:
//
//	import dist "github.com/gorun/gorun/runtime"
//
//	pg, err := dist.Init(ctx)
//	if err != nil {
//		return err
//	}
//	defer pg.Close()
//	grads := []float32{1, 2, 3}
//	if err := pg.AllReduce(ctx, dist.Of(grads), dist.Avg); err != nil {
//		return err
//	}
//
// A Tensor is a view of a Go slice, not a copy: collectives read and write
// the slice itself. Every collective has an asynchronous form, named with
// an Async suffix, that returns a Work to wait for; a group runs its
// collectives one at a time in call order, and every rank must call them
// in the same order. Each operation is bounded by the group's timeout
// (WithTimeout) as well as by its context.
//
// On GPUs, a Tensor may view device memory (NewDeviceTensor,
// DeviceTensor; Copy moves data to and from the host), and every
// collective and message accepts device tensors. With the NCCL backend
// they run on NCCL communicators of the group's own, on the GPU numbered
// LOCAL_RANK, while host tensors keep travelling over TCP and shared
// memory; on the TCP backend they are staged through host memory. The
// default backend, "auto", takes NCCL when every rank can (see
// WithBackend and BackendEnv):
//
//	x, err := dist.NewDeviceTensor(pg.Device(), dist.Float32, n)
//	err = dist.Copy(x, dist.Of(grads))
//	err = pg.AllReduce(ctx, x, dist.Avg)
//	err = dist.Copy(dist.Of(grads), x)
//
// Go values travel with the object collectives (BroadcastObject,
// AllGatherObject, GatherObject, ScatterObject), which encode them with
// encoding/gob.
package runtime

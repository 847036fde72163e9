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
// # Settings: options, then the environment, then defaults
//
// Init is the only reader of the environment among gorun's worker-side
// packages (collective and cuda take options only), and it reads it
// through one lookup: os.LookupEnv, or the one WithLookupEnv gives, which
// RecordError takes too. For every setting an option given in code wins
// over its environment variable, which wins over the default:
//
//	setting           option          environment variable              default
//	rank, world size  WithRank        RANK, WORLD_SIZE                  (required)
//	local rank, size  -               LOCAL_RANK, LOCAL_WORLD_SIZE      the rank, the world size
//	the store         WithStore       MASTER_ADDR, MASTER_PORT,         (required)
//	                                  TORCHELASTIC_USE_AGENT_STORE,
//	                                  TORCHELASTIC_RESTART_COUNT
//	backend           WithBackend     GORUN_BACKEND                     auto
//	timeout           WithTimeout     -                                 10 minutes
//	listen address    WithHost        GORUN_SOCKET_IFNAME, then         the route to MASTER_ADDR:MASTER_PORT
//	                                  GLOO_SOCKET_IFNAME (interfaces)   (port 29500 if unset), else an
//	                                                                    address of the host name, else 127.0.0.1
//	same-host path    WithTransport   GORUN_TCP_ONLY=1 (tcp), else      auto
//	                                  GORUN_TRANSPORT
//	TCP streams       WithTCPStreams  GORUN_TCP_STREAMS                 4 alone on a host, else 4 shared
//	                                                                    among its links' connections
//	algorithm         -               GORUN_ALGO                        auto (by size)
//	host identity     -               GORUN_HOST_ID                     boot id and host name
//	GPU libraries     -               GORUN_CUDA_LIBRARY,               the loader's path, then
//	                                  GORUN_NCCL_LIBRARY                NVIDIA's wheels (package cuda)
//	GPUs seen         -               CUDA_VISIBLE_DEVICES              every GPU (read by the driver)
//	NCCL's host       -               NCCL_HOSTID                       the host name (as NCCL: ranks
//	                                                                    share a GPU on the same host)
//	progress counter  -               GORUN_PROGRESS_FILE               none
//	stacks socket     -               GORUN_STACKS_SOCKET               none
//	error file        -               TORCHELASTIC_ERROR_FILE           none: RecordError does nothing
//	the environment   WithLookupEnv   -                                 os.LookupEnv
//
// GORUN_TCP_ONLY=1 means "tcp" whatever GORUN_TRANSPORT says, and
// WithTransport wins over both: WithTransport("unix") keeps Unix sockets
// under GORUN_TCP_ONLY=1. (collective.TCPOptions has the same rule one
// level down: TCPOnly wins over Transport.)
//
// One effect is process-wide: while any group is open, GOMAXPROCS is at
// least 2, as the TCP backend's poller needs a P of its own beside an
// operation spinning on its sockets; closing the last group puts back
// the value it had, unless the program changed it meanwhile.
//
// Go values travel with the object collectives (BroadcastObject,
// AllGatherObject, GatherObject, ScatterObject), which encode them with
// encoding/gob.
package runtime

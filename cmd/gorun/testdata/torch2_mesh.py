# torch 2.6's DeviceMesh and DTensor under gorun: a 2x2 mesh of 4 ranks on
# gloo, a 4x4 tensor sharded over both mesh dimensions, redistributed and
# reduced. Every rank prints what it computed; the Go test checks the values.
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
version = ".".join(torch.__version__.split(".")[:2])

full = torch.arange(16, dtype=torch.float32).reshape(4, 4)
d = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
local = ",".join(f"{v:g}" for v in d.to_local().flatten().tolist())
replicated = torch.equal(d.redistribute(mesh, [Replicate(), Replicate()]).to_local(), full)
half = d.redistribute(mesh, [Replicate(), Shard(0)]).to_local()
total = (d * 2).sum().full_tensor().item()

# Collectives on the mesh's own groups: a row ("tp") and a column ("dp").
row = torch.tensor([float(rank)])
dist.all_reduce(row, group=mesh.get_group("tp"))
col = torch.tensor([float(rank)])
dist.all_reduce(col, group=mesh.get_group("dp"))

print(f"torch={version} rank={rank} coord={mesh.get_coordinate()} local={local} replicated={replicated} "
      f"half={list(half.shape)} sum={total:g} row={row.item():g} col={col.item():g}", flush=True)
dist.destroy_process_group()

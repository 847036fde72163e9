# Real PyTorch under gorun: env:// initialisation, collectives on the world
# group and on a subgroup. Every rank prints what it computed; the Go test
# checks the values.
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"all_reduce rank={rank} value={t.item():g}", flush=True)

b = torch.tensor([float(rank * 10 + 7)])
dist.broadcast(b, src=world - 1)
print(f"broadcast rank={rank} value={b.item():g}", flush=True)

members = [r for r in range(world) if r != 1]
sub = dist.new_group(members)
if rank in members:
    s = torch.tensor([float(rank)])
    dist.all_reduce(s, group=sub)
    print(f"subgroup rank={rank} value={s.item():g}", flush=True)

dist.barrier()
dist.destroy_process_group()

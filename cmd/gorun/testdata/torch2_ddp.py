# torch 2.6 DistributedDataParallel under gorun. Every rank prints what it
# computed; the Go test checks the values.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
version = ".".join(torch.__version__.split(".")[:2])

# One weight from 0, each rank's target rank+1, squared loss, SGD at 0.1:
# only gradients averaged over the ranks move every rank's weight alike,
# towards the mean target.
model = DDP(torch.nn.Linear(1, 1, bias=False))
with torch.no_grad():
    model.module.weight.zero_()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.ones(1, 1), torch.full((1, 1), float(rank + 1))
ws = []
for _ in range(3):
    opt.zero_grad()
    ((model(x) - y) ** 2).sum().backward()
    opt.step()
    ws.append(f"{model.module.weight.item():.4f}")
print(f"torch={version} rank={rank} world={world} w={','.join(ws)}", flush=True)

# A small network seeded differently on every rank, trained on each rank's
# own data: DDP broadcasts rank 0's parameters and averages gradients, so
# the parameters stay identical.
torch.manual_seed(rank)
net = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
for _ in range(5):
    xb = torch.randn(32, 8)
    opt.zero_grad()
    ((net(xb) - xb.sum(1, keepdim=True)) ** 2).mean().backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in net.parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
same = all(torch.equal(g, gathered[0]) for g in gathered)
print(f"rank={rank} identical={same} digest={flat.double().sum().item():.9f}", flush=True)

dist.barrier()
dist.destroy_process_group()

# A torch 2.6 job on gorun's c10d rendezvous: the last rank fails on the
# first attempt; after the job-wide restart every rank completes.
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
version = ".".join(torch.__version__.split(".")[:2])
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
if restart == 0 and rank == world - 1:
    print(f"rank={rank} fails on purpose", flush=True)
    sys.exit(5)
dist.barrier()
print(f"torch={version} rank={rank} world={world} restart={restart} group={os.environ['GROUP_RANK']} sum={t[0].item():g}", flush=True)
dist.destroy_process_group()

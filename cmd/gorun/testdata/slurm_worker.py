# A worker for the tests on a real Slurm cluster: it prints where it runs
# and the place gorun gave it, after a gloo all_reduce across every rank
# proves that they all met. The Go test checks the line of each rank.
import os
import socket

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)

keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS"]
fields = [f"{k}={os.environ.get(k, '')}" for k in keys]
fields += [f"HOST={socket.gethostname()}", f"SUM={total.item():g}"]
print("worker " + " ".join(fields), flush=True)
dist.destroy_process_group()

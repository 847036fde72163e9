"""The anchors gorun's collectives are measured against, in nccl-tests'
output format: torch's gloo backend (run this file under gorun or torchrun)
or OpenMPI through mpi4py (run it under mpirun with --mpi).

    gorun --nproc-per-node 4 --python /usr/bin/python3 bench/anchor.py -b 1M -e 16M
    mpirun -np 4 /usr/bin/python3 bench/anchor.py --mpi -b 1M -e 16M
"""
import argparse
import sys
import time

import numpy as np

# nccl-tests' bus bandwidth factors, by world size n.
BUS_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1,
    "allgather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def sizes(args):
    s = args.b
    while s <= args.e:
        yield s
        s *= args.f


class Gloo:
    name = "gloo"

    def __init__(self):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def buffers(self, op, count):
        t = self.torch
        n = self.size
        if op == "allgather":
            return t.ones(count // n), [t.empty(count // n) for _ in range(n)]
        if op == "reduce_scatter":
            return [t.ones(count // n) for _ in range(n)], t.empty(count // n)
        if op == "alltoall":
            return t.ones(count), t.empty(count)
        return t.ones(count), None

    def run(self, op, a, b):
        d = self.dist
        if op == "allreduce":
            d.all_reduce(a)
        elif op == "broadcast":
            d.broadcast(a, 0)
        elif op == "allgather":
            d.all_gather(b, a)
        elif op == "reduce_scatter":
            d.reduce_scatter(b, a)
        elif op == "alltoall":
            d.all_to_all_single(b, a)

    def barrier(self):
        self.dist.barrier()


class MPI:
    name = "mpi"

    def __init__(self):
        from mpi4py import MPI as mpi

        self.mpi = mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def buffers(self, op, count):
        n = self.size
        if op in ("allgather", "reduce_scatter"):
            small, big = np.ones(count // n, np.float32), np.empty(count // n * n, np.float32)
            return (small, big) if op == "allgather" else (np.ones(count // n * n, np.float32), small.copy())
        if op == "alltoall":
            return np.ones(count // n * n, np.float32), np.empty(count // n * n, np.float32)
        return np.ones(count, np.float32), None

    def run(self, op, a, b):
        c = self.comm
        if op == "allreduce":
            c.Allreduce(self.mpi.IN_PLACE, a, op=self.mpi.SUM)
        elif op == "broadcast":
            c.Bcast(a, root=0)
        elif op == "allgather":
            c.Allgather(a, b)
        elif op == "reduce_scatter":
            c.Reduce_scatter_block(a, b, op=self.mpi.SUM)
        elif op == "alltoall":
            c.Alltoall(a, b)

    def barrier(self):
        self.comm.Barrier()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mpi", action="store_true", help="OpenMPI through mpi4py instead of torch gloo")
    p.add_argument("-o", default="allreduce", choices=sorted(BUS_FACTOR))
    p.add_argument("-b", default="8", type=parse_size)
    p.add_argument("-e", default="64M", type=parse_size)
    p.add_argument("-f", default=2, type=int)
    p.add_argument("-w", default=5, type=int, help="warmup iterations")
    p.add_argument("-n", default=20, type=int, help="timed iterations")
    args = p.parse_args()
    be = MPI() if args.mpi else Gloo()
    if be.rank == 0:
        print(f"# {be.name} {args.o}: world {be.size}, float32")
        print("#       size         count      type   redop    root     time   algbw   busbw")
        print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")
    for size in sizes(args):
        count = max(size // 4, 1)
        if args.o in ("allgather", "reduce_scatter", "alltoall"):
            count = max(count - count % be.size, be.size)
        a, b = be.buffers(args.o, count)
        for _ in range(args.w):
            be.run(args.o, a, b)
        be.barrier()
        start = time.perf_counter()
        for _ in range(args.n):
            be.run(args.o, a, b)
        elapsed = (time.perf_counter() - start) / args.n
        if be.rank == 0:
            nbytes = count * 4
            algbw = nbytes / elapsed / 1e9
            busbw = algbw * BUS_FACTOR[args.o](be.size)
            print(f"{nbytes:12d}  {count:12d}     float     sum      -1  {elapsed * 1e6:7.1f}  {algbw:6.2f}  {busbw:6.2f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The anchors gorun's collectives are measured against, printing the rows
allreduce-perf prints: torch's gloo backend (run this file under gorun or
torchrun) or OpenMPI through mpi4py (run it under mpirun with --mpi).

    gorun --nproc-per-node 4 --python /usr/bin/python3 bench/anchor.py -o allgather -b 1M -e 16M
    mpirun -np 4 /usr/bin/python3 bench/anchor.py --mpi -sizes 8,1M -w 20,3 -n 500,50

Measured exactly as allreduce-perf measures gorun (see the top of
compare.py): float32; SIZE is the whole buffer (the allgather output, the
reduce_scatter input, one rank's alltoall send buffer), rounded down to a
multiple of the world size, at least one element per rank, for allgather,
reduce_scatter and alltoall; each rank times -n calls after -w warmups and
a barrier, and the slowest rank's mean time is reported; algbw is SIZE over
that time, busbw is algbw times nccl-tests' factor.

A collective the backend lacks (gloo has no reduce_scatter in torch 1.13)
prints one "# unsupported: ..." line and exits 0; any other failure exits
non-zero.
"""
import argparse
import sys
import time

import numpy as np

from common import BUS_FACTOR, PER_RANK, elements, parse_size

REDOP = {"allreduce": "sum", "reduce_scatter": "sum"}


class Unsupported(Exception):
    """The backend does not implement the collective."""


def parse_counts(s):
    return [int(v) for v in s.split(",")]


def plan(args):
    """The sizes to run, each with its warmup and timed iteration counts."""
    if args.sizes:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    else:
        sizes, s = [], parse_size(args.b)
        while s <= parse_size(args.e):
            sizes.append(s)
            s *= args.f
    for flag, counts in (("-w", args.w), ("-n", args.n)):
        if len(counts) not in (1, len(sizes)):
            sys.exit(f"anchor.py: {flag} {counts}: want one count or one per size ({len(sizes)} sizes)")
    pick = lambda counts, i: counts[0] if len(counts) == 1 else counts[i]
    return [(size, pick(args.w, i), pick(args.n, i)) for i, size in enumerate(sizes)]


class Gloo:
    name = "gloo"

    def __init__(self):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def buffers(self, op, count):
        """Buffers for SIZE = count elements in all."""
        t, n = self.torch, self.size
        if op == "allgather":
            return t.ones(count // n), [t.empty(count // n) for _ in range(n)]
        if op == "reduce_scatter":
            return [t.ones(count // n) for _ in range(n)], t.empty(count // n)
        if op == "alltoall":
            return t.ones(count), t.empty(count)
        return t.ones(count), None

    def run(self, op, a, b):
        d = self.dist
        try:
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
        except RuntimeError as e:
            # Raised locally on every rank before any traffic, so every
            # rank stops here alike.
            if "does not support" in str(e):
                raise Unsupported(str(e)) from e
            raise

    def slowest(self, seconds):
        t = self.torch.tensor([seconds], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.item()

    def barrier(self):
        self.dist.barrier()

    def close(self):
        # Tear gloo down while every rank is still here: left to exit,
        # its threads sometimes abort the process ("terminate called
        # without an active exception").
        self.dist.barrier()
        self.dist.destroy_process_group()


class MPI:
    name = "mpi"

    def __init__(self):
        from mpi4py import MPI as mpi

        self.mpi = mpi
        self.comm = mpi.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def buffers(self, op, count):
        """Buffers for SIZE = count elements in all."""
        per = count // self.size
        if op == "allgather":
            return np.ones(per, np.float32), np.empty(count, np.float32)
        if op == "reduce_scatter":
            return np.ones(count, np.float32), np.empty(per, np.float32)
        if op == "alltoall":
            return np.ones(count, np.float32), np.empty(count, np.float32)
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

    def slowest(self, seconds):
        return self.comm.allreduce(seconds, op=self.mpi.MAX)

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        pass  # mpi4py finalizes at exit


def measure(be, op, size, warmup, iters):
    """Runs op at size bytes and returns (count, slowest rank's mean seconds)."""
    count = elements(op, size, be.size)
    a, b = be.buffers(op, count)
    for _ in range(warmup):
        be.run(op, a, b)
    be.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        be.run(op, a, b)
    return count, be.slowest((time.perf_counter() - start) / iters)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mpi", action="store_true", help="OpenMPI through mpi4py instead of torch gloo")
    p.add_argument("-o", default="allreduce", choices=sorted(BUS_FACTOR))
    p.add_argument("-b", default="8", help="minimum size in bytes (K, M, G suffixes)")
    p.add_argument("-e", default="64M", help="maximum size in bytes")
    p.add_argument("-f", default=2, type=int, help="multiplication factor between sizes")
    p.add_argument("-sizes", default="", help="comma-separated sizes to run instead of -b, -e and -f")
    p.add_argument("-w", default=[5], type=parse_counts, help="warmup iterations: one, or one per size of -sizes")
    p.add_argument("-n", default=[20], type=parse_counts, help="timed iterations: one, or one per size of -sizes")
    args = p.parse_args()
    steps = plan(args)
    be = MPI() if args.mpi else Gloo()
    n = be.size
    if be.rank == 0:
        print(f"# {be.name} {args.o}: world {n}, float32")
        print("#       size         count      type   redop    root      time   algbw   busbw  #wrong")
        print("#        (B)    (elements)                                (us)  (GB/s)  (GB/s)        ")
    for size, warmup, iters in steps:
        try:
            count, seconds = measure(be, args.o, size, warmup, iters)
        except Unsupported as e:
            if be.rank == 0:
                print(f"# unsupported: {e}")
            break
        if be.rank == 0:
            nbytes = count * 4
            algbw = nbytes / seconds / 1e9
            busbw = algbw * BUS_FACTOR[args.o](n)
            # As nccl-tests: count is what one rank passes to the call.
            shown = count // n if args.o in PER_RANK else count
            print(f"  {nbytes:10d}  {shown:12d}  {'float32':>8s}  {REDOP.get(args.o, 'none'):>6s}  {-1:6d}"
                  f"  {seconds * 1e6:8.1f}  {algbw:6.2f}  {busbw:6.2f}  {'N/A':>6s}")
            sys.stdout.flush()
    be.close()


if __name__ == "__main__":
    main()

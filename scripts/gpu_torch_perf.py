"""torch's own figures beside gorun's on the same GPU(s), part (3) of
scripts/gpu-check.sh, in the same run as bin/allreduce-perf and
bin/copy-perf:

    gorun --nproc-per-node 1 scripts/gpu_torch_perf.py --backend nccl --copies
    gorun --nproc-per-node 4 scripts/gpu_torch_perf.py --backend gloo    # on CPU

The all_reduce (sum, float32) goes through torch.distributed on the
backend, at the sizes allreduce-perf's -b, -e and -f give, with
nccl-tests' formulas: algbw = bytes / time, busbw = algbw * 2(n-1)/n.
Like nccl-tests, the timed iterations are queued back to back and waited
for once. Rank 0 prints a line per size in allreduce-perf's columns,
and each result is checked (the sum of every rank's rank + 1).

With --copies, rank 0 then times host-device copies as torch makes them
(cudaMemcpy): from and to pageable and pinned host memory, at copy-perf's
sizes.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(s[:-1] if mult > 1 else s) * mult


def sizes(lo, hi, factor):
    s = lo
    while s <= hi:
        yield s
        s *= factor


def all_reduce_table(device, world, lo, hi, factor, warmup, iters):
    rank = dist.get_rank()
    if rank == 0:
        print(f"# torch {torch.__version__} all_reduce: world {world}, backend {dist.get_backend()}, "
              f"device {device}, warmup iters: {warmup} iters: {iters}", flush=True)
        print(f"# {'size':>10}  {'count':>12}  {'time':>8}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}")
        print(f"# {'(B)':>10}  {'(elements)':>12}  {'(us)':>8}  {'(GB/s)':>6}  {'(GB/s)':>6}")
    wrong_total = 0
    for size in sizes(lo, hi, factor):
        count = max(size // 4, 1)
        x = torch.full((count,), float(rank + 1), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(x)
        sync(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync(device)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        x.fill_(float(rank + 1))
        dist.all_reduce(x)
        wrong = int((x != world * (world + 1) / 2).sum().item())
        wrong_total += wrong
        seconds = elapsed.item()
        algbw = count * 4 / seconds / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(f"  {count * 4:>10}  {count:>12}  {seconds * 1e6:>8.1f}  {algbw:>6.2f}  {busbw:>6.2f}  {wrong:>6}", flush=True)
    if rank == 0:
        print(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}", flush=True)
    return wrong_total


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copies_table(device, largest, min_time):
    """cudaMemcpy's bandwidth as torch uses it, at copy-perf's sizes."""
    print(f"# torch copies: {torch.cuda.get_device_name(device)}, cudaMemcpy through tensor.copy_", flush=True)
    print(f"# {'size (B)':>12}  {'HtoD pageable':>13}  {'DtoH pageable':>13}  {'HtoD pinned':>11}  {'DtoH pinned':>11}  (GB/s)")
    size = 4 << 10
    ladder = []
    while size < largest:
        ladder.append(size)
        size *= 16
    ladder.append(largest)
    for size in ladder:
        gpu = torch.empty(size, dtype=torch.uint8, device=device)
        row = []
        for pinned in (False, True):
            host = torch.randint(0, 256, (size,), dtype=torch.uint8)
            if pinned:
                host = host.pin_memory()
            row += [timed(lambda: gpu.copy_(host), device, size, min_time),
                    timed(lambda: host.copy_(gpu), device, size, min_time)]
            back = torch.empty_like(host)
            back.copy_(gpu)
            if not torch.equal(back, host):
                raise AssertionError(f"{size} bytes came back changed")
        print(f"  {size:>12}  {row[0]:>13.2f}  {row[1]:>13.2f}  {row[2]:>11.2f}  {row[3]:>11.2f}", flush=True)


def timed(copy, device, size, min_time):
    """GB/s of copy, run once untimed, then at least 3 times and min_time."""
    copy()
    torch.cuda.synchronize(device)
    n, start = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - start < min_time:
        copy()
        torch.cuda.synchronize(device)  # each copy whole, as copy-perf's
        n += 1
    return size / ((time.perf_counter() - start) / n) / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    parser.add_argument("-b", default="8", help="smallest all_reduce in bytes (K, M, G suffixes)")
    parser.add_argument("-e", default="256M", help="largest all_reduce")
    parser.add_argument("-f", type=int, default=4, help="factor between sizes")
    parser.add_argument("-w", type=int, default=5, help="warmup iterations")
    parser.add_argument("-n", type=int, default=20, help="timed iterations")
    parser.add_argument("--copies", action="store_true", help="then time host-device copies on rank 0")
    parser.add_argument("--max-mib", type=int, default=1024, help="the largest copy, in MiB")
    args = parser.parse_args()

    if args.backend == "nccl" or args.copies:
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend)
    world = dist.get_world_size()
    tensors_on = device if args.backend == "nccl" else torch.device("cpu")
    wrong = all_reduce_table(tensors_on, world, parse_size(args.b), parse_size(args.e), args.f, args.w, args.n)
    if args.copies and dist.get_rank() == 0:
        copies_table(device, args.max_mib << 20, 0.2)
    dist.barrier()
    dist.destroy_process_group()
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()

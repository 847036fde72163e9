"""A PyTorch job under gorun: every collective and message of
torch.distributed on one backend, each result checked against the value
it must have, then a few steps of DistributedDataParallel training, whose
loss must fall and whose parameters must stay the same on every rank.
Part (4) of scripts/gpu-check.sh:

    gorun --nproc-per-node 4 scripts/gpu_torch_job.py --backend gloo
    gorun --nproc-per-node 1 scripts/gpu_torch_job.py --backend nccl

Rank 0 prints one line per operation, PASS, FAIL or N/A (the backend
does not have it), and every rank exits 1 when an operation failed on
any rank. NCCL runs on the GPU numbered LOCAL_RANK.
"""

import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    args = parser.parse_args()

    if args.backend == "nccl":
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    if rank == 0:
        print(f"torch {torch.__version__}, backend {args.backend}, {world} ranks, device {device}", flush=True)

    failures = 0
    for name, op in checks(rank, world, device):
        try:
            op()
            status, detail = "PASS", ""
        except Unsupported as e:
            status, detail = "N/A ", str(e)
        except Exception as e:  # any failure of the operation or its check
            status, detail = "FAIL", f"{type(e).__name__}: {e}"
            traceback.print_exc()
        # Every rank learns the worst outcome, over the backend itself.
        worst = torch.tensor([{"PASS": 0, "N/A ": 1, "FAIL": 2}[status]], device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        status = ["PASS", "N/A ", "FAIL"][int(worst.item())]
        if status == "FAIL":
            failures += 1
        if rank == 0:
            print(f"{status}  {name}{'  ' + detail if detail and status != 'PASS' else ''}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"torch job: {failures} of the operations failed on backend {args.backend}", flush=True)
    sys.exit(1 if failures else 0)


class Unsupported(Exception):
    """The backend lacks the operation."""


def unsupported_by(backend_error):
    """Turns torch's 'not supported' errors into Unsupported."""
    text = str(backend_error)
    return any(s in text for s in ("not supported", "does not support", "no support", "not implemented",
                                   "Not implemented", "Cannot use ReduceOp", "Invalid scalar type"))


def expect(what, got, want):
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"{what}: got {got.tolist()}, want {want.tolist()}")


def checks(rank, world, device):
    def t(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype, device=device)

    def attempt(fn):
        def run():
            try:
                fn()
            except AttributeError as e:  # an older torch
                raise Unsupported(str(e)) from e
            except (RuntimeError, ValueError, NotImplementedError) as e:
                if unsupported_by(e):
                    raise Unsupported(str(e).splitlines()[0]) from e
                raise
        return run

    total = world * (world + 1) // 2  # sum of rank+1

    def all_reduce(op, dtype, values, want):
        def run():
            x = t(values, dtype)
            dist.all_reduce(x, op=op)
            expect("all_reduce", x, t(want, dtype))
        return run

    def broadcast():
        x = t([rank, rank * 2])
        dist.broadcast(x, src=world - 1)
        expect("broadcast", x, t([world - 1, 2 * (world - 1)]))

    def reduce():
        x = t([rank + 1.0])
        dist.reduce(x, dst=0)
        if rank == 0:
            expect("reduce", x, t([total]))

    def all_gather():
        out = [t([-1.0, -1.0]) for _ in range(world)]
        dist.all_gather(out, t([rank, 10 * rank]))
        for i in range(world):
            expect(f"all_gather[{i}]", out[i], t([i, 10 * i]))

    def all_gather_into_tensor():
        out = t([-1.0] * (2 * world))
        dist.all_gather_into_tensor(out, t([rank, 10 * rank]))
        expect("all_gather_into_tensor", out, t([v for i in range(world) for v in (i, 10 * i)]))

    def gather():
        out = [t([-1.0]) for _ in range(world)] if rank == 0 else None
        dist.gather(t([rank + 100.0]), out, dst=0)
        if rank == 0:
            for i in range(world):
                expect(f"gather[{i}]", out[i], t([i + 100.0]))

    def scatter():
        x = t([-1.0])
        dist.scatter(x, [t([i * i]) for i in range(world)] if rank == 0 else None, src=0)
        expect("scatter", x, t([rank * rank]))

    def reduce_scatter():
        out = t([-1.0])
        dist.reduce_scatter(out, [t([rank + i]) for i in range(world)])
        expect("reduce_scatter", out, t([sum(r + rank for r in range(world))]))

    def reduce_scatter_tensor():
        out = t([-1.0, -1.0])
        dist.reduce_scatter_tensor(out, t([float(i) for i in range(2 * world)]))
        expect("reduce_scatter_tensor", out, t([world * 2 * rank, world * (2 * rank + 1)]))

    def all_to_all_single():
        out = t([-1.0] * world)
        dist.all_to_all_single(out, t([10 * rank + i for i in range(world)]))
        expect("all_to_all_single", out, t([10 * s + rank for s in range(world)]))

    def all_to_all():
        out = [t([-1.0]) for _ in range(world)]
        dist.all_to_all(out, [t([100 * rank + d]) for d in range(world)])
        for s in range(world):
            expect(f"all_to_all[{s}]", out[s], t([100 * s + rank]))

    def send_recv():
        if world < 2:
            raise Unsupported("needs two ranks")
        peer = rank ^ 1
        if peer >= world:
            return
        got = t([-1.0])
        if rank % 2 == 0:
            dist.send(t([rank + 0.5]), peer)
            dist.recv(got, peer)
        else:
            dist.recv(got, peer)
            dist.send(t([rank + 0.5]), peer)
        expect("send/recv", got, t([peer + 0.5]))

    def batch_isend_irecv():
        if world < 2:
            raise Unsupported("needs two ranks")
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = t([-1.0])
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t([float(rank)]), nxt),
                                       dist.P2POp(dist.irecv, got, prv)])
        for r in reqs:
            r.wait()
        expect("batch_isend_irecv", got, t([float(prv)]))

    def new_group():
        members = list(range(0, world, 2))
        g = dist.new_group(members)
        if rank in members:
            x = t([float(rank)])
            dist.all_reduce(x, group=g)
            expect("new_group all_reduce", x, t([float(sum(members))]))

    def barrier():
        dist.barrier()

    def monitored_barrier():
        dist.monitored_barrier()

    def ddp_training():
        torch.manual_seed(0)  # the same initial model on every rank, as DDP also makes sure
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
        target = torch.arange(16, dtype=torch.float32) / 16

        def batch():
            x = torch.randn(64, 16, generator=data)
            return x.to(device), (x @ target).unsqueeze(1).to(device)

        probe = batch()
        first = torch.nn.functional.mse_loss(ddp(probe[0]), probe[1]).item()
        for _ in range(30):
            x, y = batch()
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        last = torch.nn.functional.mse_loss(ddp(probe[0]), probe[1]).item()
        if not last < first / 2:
            raise AssertionError(f"the loss went from {first:.4f} to {last:.4f}, want it halved")
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        for r in range(world):
            if not torch.equal(every[r], flat):
                raise AssertionError(f"rank {r}'s parameters differ from rank {rank}'s")

    sum_, max_ = dist.ReduceOp.SUM, dist.ReduceOp.MAX
    yield "all_reduce sum float32", attempt(all_reduce(sum_, torch.float32, [rank + 1.0, 1.0], [total, world]))
    yield "all_reduce max int64", attempt(all_reduce(max_, torch.int64, [rank], [world - 1]))
    yield "all_reduce sum bfloat16", attempt(all_reduce(sum_, torch.bfloat16, [rank + 1.0], [total]))
    yield "all_reduce sum float16", attempt(all_reduce(sum_, torch.float16, [rank + 1.0], [total]))
    if hasattr(dist.ReduceOp, "AVG"):
        yield "all_reduce avg float32", attempt(all_reduce(dist.ReduceOp.AVG, torch.float32, [2.0 * rank], [world - 1.0]))
    yield "broadcast", attempt(broadcast)
    yield "reduce", attempt(reduce)
    yield "all_gather", attempt(all_gather)
    yield "all_gather_into_tensor", attempt(all_gather_into_tensor)
    yield "gather", attempt(gather)
    yield "scatter", attempt(scatter)
    yield "reduce_scatter", attempt(reduce_scatter)
    yield "reduce_scatter_tensor", attempt(reduce_scatter_tensor)
    yield "all_to_all_single", attempt(all_to_all_single)
    yield "all_to_all", attempt(all_to_all)
    yield "send/recv", attempt(send_recv)
    yield "batch_isend_irecv", attempt(batch_isend_irecv)
    yield "new_group", attempt(new_group)
    yield "barrier", attempt(barrier)
    if dist.get_backend() == "gloo":
        yield "monitored_barrier", attempt(monitored_barrier)
    yield "ddp training", ddp_training


if __name__ == "__main__":
    main()

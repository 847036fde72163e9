"""gorun's rendezvous as a client of torch's own TCPStore server, libuv's
where torch has it (2.4 on, unless built without). Part (6) of
scripts/gpu-check.sh, beside Go workers under torch's torchrun, whose
agent hosts the same kind of server for them:

    python3 scripts/gpu_libuv_store.py --want-libuv -- bin/gorun --nproc-per-node 2 bin/gpucheck -backend tcp

It hosts torch's server on a free port of 127.0.0.1, then runs the given
gorun command as a c10d node against it (--rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT --rdzv-conf is_host=false): every node's
join, heartbeats and the job's end go through that store. It prints
which server it hosted, the command's exit status and the keys the job
left there, and exits 1 unless the command succeeded on a store that
holds its keys (and, with --want-libuv, is libuv's).
"""

import argparse
import datetime
import subprocess
import sys

import torch
import torch.distributed as dist


def host_store(want_libuv):
    kwargs = dict(is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    try:
        return dist.TCPStore("127.0.0.1", 0, use_libuv=True, **kwargs)
    except (TypeError, RuntimeError) as e:  # before 2.3, no use_libuv; or built without libuv
        if want_libuv:
            raise SystemExit(f"gpu_libuv_store: torch {torch.__version__} hosts no libuv server: {e}")
    try:
        return dist.TCPStore("127.0.0.1", 0, use_libuv=False, **kwargs)
    except TypeError:
        return dist.TCPStore("127.0.0.1", 0, **kwargs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--want-libuv", action="store_true", help="fail unless torch's server is libuv's")
    parser.add_argument("--rdzv-id", default="libuv-check")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- gorun [flags] PROGRAM [ARGS...]")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the gorun command after --")

    store = host_store(args.want_libuv)
    libuv = bool(getattr(store, "libuvBackend", False))
    print(f"gpu_libuv_store: torch {torch.__version__}'s TCPStore server on 127.0.0.1:{store.port}, libuv: {libuv}", flush=True)
    if args.want_libuv and not libuv:
        print("gpu_libuv_store: FAIL: torch's server is not libuv's", flush=True)
        return 1

    gorun, rest = command[0], command[1:]
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store.port}",
            "--rdzv-conf", "is_host=false", "--rdzv-id", args.rdzv_id]
    status = subprocess.call([gorun, *c10d, *rest])
    keys = store.num_keys()
    print(f"gpu_libuv_store: gorun exited {status}; the job left {keys} keys in torch's store", flush=True)
    ok = status == 0 and keys > 1  # more than the server's own
    print(f"gpu_libuv_store: {'PASS' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Store throughput: torch 1.13's own TCPStore clients doing set, get and
add against torch's TCPStore server and against gorun's (bench/storeserver,
the server every gorun agent hosts), each server in its own process,
interleaved round by round.

Every client is one TCPStore connection in its own process, forked from
this one once torch is imported, as every rank of a job is its own
process. Python threads would share one GIL: their figures then say how
the server's wake-ups fall against the GIL's hand-offs (16 client threads
switched context 4x as often against a server that sleeps between
requests), not how fast it serves. A run spreads a fixed number of
operations evenly over the clients, starts them together, and counts
until the last one is done; a set has no reply in torch 1.13's protocol,
so each set client ends with one round trip (num_keys) and is counted
only once the server has applied its sets. Values are 32 bytes, about a
rank's address.

    /usr/bin/python3 bench/store.py            # this section alone
    /usr/bin/python3 bench/store.py --serve-torch   # torch's server, prints its address
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta

from common import PY, ROOT, log

OPS = ("set", "get", "add")
CLIENTS = (1, 16, 64)
VALUE = b"0123456789abcdef0123456789abcdef"
TIMEOUT = timedelta(seconds=60)


def serve_torch():
    """Serves torch's TCPStore on an ephemeral loopback port until killed."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    print(f"listening on 127.0.0.1:{server.port}", flush=True)
    signal.sigwait(stop)


def servers():
    """The command line of each server; each prints 'listening on HOST:PORT'."""
    return {
        "gorun": [os.path.join(ROOT, "bin", "storeserver"), "-addr", "127.0.0.1:0"],
        "torch": [PY, os.path.abspath(__file__), "--serve-torch"],
    }


def start(name, cmd):
    """Starts a server and returns (process, port)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        proc.wait()
        sys.exit(f"store: the {name} server ({' '.join(cmd)}) did not say where it listens; it printed {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def count_for(clients, quick):
    """Operations per run: enough for about half a second on a busy 2-core machine."""
    n = 10000 if clients == 1 else 30000
    return n // 4 if quick else n


def load(port, op, clients, total):
    """Runs total operations of op over clients connections, one process
    each; returns ops/s."""
    import multiprocessing

    import torch.distributed  # noqa: F401 (once, here, not in every client)

    ctx = multiprocessing.get_context("fork")
    per = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
    ready = ctx.Barrier(clients + 1, timeout=TIMEOUT.total_seconds())
    done = ctx.Barrier(clients + 1, timeout=TIMEOUT.total_seconds())
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=client, args=(port, op, i, per[i], ready, done, errors)) for i in range(clients)]
    for p in procs:
        p.start()
    try:
        ready.wait()
        begin = time.perf_counter()
        done.wait()
        elapsed = time.perf_counter() - begin
    except threading.BrokenBarrierError:
        elapsed = None
    for p in procs:
        p.join()
    if not errors.empty() or elapsed is None:
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        sys.exit(f"store: {op} with {clients} clients on port {port} failed: " + ("; ".join(failures[:3]) or "a client died"))
    return total / elapsed


def client(port, op, i, count, ready, done, errors):
    """One client process: connects, waits for the others, runs count
    operations of op, and waits for the rest to finish."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT)
        if i == 0:
            store.set("bench/get", VALUE)
        ready.wait()
        if op == "set":
            key = f"bench/set/{i}"
            for _ in range(count):
                store.set(key, VALUE)
            store.num_keys()  # a round trip: the server applied the sets
        elif op == "get":
            for _ in range(count):
                store.get("bench/get")
        else:
            for _ in range(count):
                store.add("bench/add", 1)
        done.wait()
    except Exception as e:  # reported by load, with the client that failed
        errors.put(f"client {i}: {e!r}")
        ready.abort()
        done.abort()


def run(rounds, quick=False, clients_list=CLIENTS):
    """Measures every server; returns {(server, op, clients): [ops/s per round]}."""
    started = {name: start(name, cmd) for name, cmd in servers().items()}
    results = {}
    try:
        for r in range(rounds):
            names = list(started)
            names = names[r % len(names):] + names[:r % len(names)]
            for clients in clients_list:
                for op in OPS:
                    for name in names:
                        rate = load(started[name][1], op, clients, count_for(clients, quick))
                        results.setdefault((name, op, clients), []).append(rate)
                log(f"[store round {r + 1}/{rounds}] {clients} clients done")
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(timeout=10)
    return results


def render(results, rounds, clients_list=CLIENTS):
    """The markdown table: median ops/s per server and gorun's ratio."""
    lines = [
        f"### Store: ops/s from torch 1.13's TCPStore clients (one process each), median of {rounds} rounds",
        "",
        "| op | clients | gorun | torch | gorun/torch |",
        "|---|---|---|---|---|",
    ]
    for op in OPS:
        for clients in clients_list:
            ours = statistics.median(results[("gorun", op, clients)])
            theirs = statistics.median(results[("torch", op, clients)])
            lines.append(f"| {op} | {clients} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve-torch", action="store_true", help="serve torch's TCPStore and print its address")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.serve_torch:
        serve_torch()
        return
    print("\n".join(render(run(args.rounds, args.quick), args.rounds)))


if __name__ == "__main__":
    main()

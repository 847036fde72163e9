"""Scale: rounds of thousands of nodes. Runs the Go benchmarks of the
dynamic (c10d) rendezvous, on the in-process store and over TCP with a
connection per node, and of the etcd backend on a 3-member etcd cluster
on loopback, at 200, 1,000 and 4,096 simulated nodes joining one round at
once (min = max = nodes), and checks that 4,096 nodes form a round in
under 2 s on each backend and that the time per node stays flat (at
4,096 nodes at most 2x what it is at 200), as do the requests each node
makes where the benchmark counts them (at most 1.25x).

    /usr/bin/python3 bench/scale_rdzv.py [--quick]    # this section alone

--quick runs each size once (Go's -benchtime 1x), and the etcd backend
at 200 nodes only. A size that fails, or outlasts its bound, is reported
as such and misses its goal. Timings on a machine shared with other work
are noisy: the c10d rows also give the benchmark process's CPU time per
round, which others' load disturbs less.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

from common import ROOT, log

SIZES = (200, 1000, 4096)
GOAL_S = 2.0  # 4,096 nodes form a round in under this
LINEAR = 2.0  # time per node at 4,096 at most this multiple of that at 200
LINEAR_REQUESTS = 1.25  # and requests per node, where the benchmark counts them

# backend -> (package, benchmark, sub-benchmark name pattern with {n},
# seconds a run may take, whether each size runs on its own)
BENCHES = {
    "c10d, in-process store": ("./rendezvous/", "BenchmarkDynamicJoin", "store=memory/nodes={n}", 300, False),
    "c10d, TCP store": ("./rendezvous/", "BenchmarkDynamicJoin", "store=tcp/nodes={n}", 300, False),
    # Each size apart, with its own bound, so that a size that takes too
    # long costs no other's figure.
    "etcd, 3 members": ("./rendezvous/etcd/", "BenchmarkRound", "nodes={n}", 120, True),
}

LINE = re.compile(r"^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$")


def need(tool, package):
    if shutil.which(tool) is None:
        sys.exit(f"scale_rdzv: {tool} not found: apt-get install {package}")


def parse(out):
    """Go benchmark output -> {name: {unit: value}}."""
    results = {}
    for line in out.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        fields = m.group(3).split()
        metrics = {unit: float(value) for value, unit in zip(fields[::2], fields[1::2])}
        results[m.group(1)] = metrics
    return results


def go_bench(pkg, bench, sub, times, timeout):
    """Runs the benchmarks and returns their results, or the reason none
    came (a failure, or the run past timeout, in seconds)."""
    argv = ["go", "test", "-run", "^$", "-bench", f"^{bench}$/{sub}", "-benchtime", f"{times}x",
            "-benchmem", "-timeout", f"{timeout}s", pkg]
    log("[scale_rdzv] " + " ".join(argv))
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout + 120)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        why = next((l.strip() for l in tail if "panic: test timed out" in l), None)
        why = why or next((l.strip() for l in reversed(tail) if l.strip().startswith(("bench_test.go", "dynamic_test.go"))), None)
        log(f"scale_rdzv: {' '.join(argv)} failed:\n" + "\n".join(tail[-20:]))
        return parse(proc.stdout), why or "failed"
    return parse(proc.stdout), None


def run(rounds, quick=False):
    """Runs every backend at every size; returns
    {backend: {nodes: {unit: value}}}."""
    need("go", "golang-go")
    need("etcd", "etcd-server")
    times = 1 if quick else max(rounds, 1)
    result = {}
    for backend, (pkg, bench, sub, timeout, apart) in BENCHES.items():
        sizes = [n for n in SIZES if not (quick and apart and n > SIZES[0])]
        groups = [[n] for n in sizes] if apart else [sizes]
        rows = {}
        for group in groups:
            pattern = sub.format(n="(" + "|".join(str(n) for n in group) + ")$")
            found, why = go_bench(pkg, bench, pattern, times, timeout)
            for n in group:
                name = f"{bench}/{sub.format(n=n)}"
                rows[str(n)] = found.get(name) or {"error": why or "no result"}
        result[backend] = rows
    return result


def render(result):
    """The markdown table, the goal lines and the verdicts."""
    lines = [
        "### Scale: rendezvous rounds of 200 to 4,096 nodes (one round, all joining at once)",
        "",
        "| backend | nodes | time per round (ms) | per node (µs) | CPU per round (ms) | requests per node | allocations per round |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    goals = []
    for backend, rows in result.items():
        for n, m in rows.items():
            if "error" in m:
                lines.append(f"| {backend} | {int(n):,} | no round: {m['error']} | | | | |")
                continue
            ms = m["ms/round"]
            cpu = f"{m['cpu-ms/round']:.0f}" if "cpu-ms/round" in m else "-"
            if "cpu-s/round" in m:
                # The nodes' processor time, and the etcd members'.
                cpu = f"{m['cpu-s/round'] * 1e3:.0f} + etcd {m.get('etcd-cpu-s/round', 0) * 1e3:.0f}"
            reqs = f"{m['requests/node']:.1f}" if "requests/node" in m else "-"
            allocs = f"{m.get('allocs/op', 0):,.0f}"
            lines.append(f"| {backend} | {int(n):,} | {ms:.0f} | {ms * 1e3 / int(n):.0f} | {cpu} | {reqs} | {allocs} |")
        small, big = rows.get(str(SIZES[0])), rows.get(str(SIZES[-1]))
        if big is None:
            goals.append(f"- {backend}: 4,096 nodes not measured (--quick).")
            continue
        if "error" in big or "error" in small:
            verdicts.append((f"rendezvous {backend}: 4,096 nodes form a round in < {GOAL_S:g} s", "no round", False))
            goals.append(f"- {backend}: no 4,096-node figure (a size failed or ran out of time), MISSED.")
            continue
        secs = big["ms/round"] / 1e3
        met = secs < GOAL_S
        verdicts.append((f"rendezvous {backend}: 4,096 nodes form a round in < {GOAL_S:g} s",
                         f"{secs:.2f} s", met))
        goals.append(f"- {backend}: 4,096 nodes in {secs:.2f} s (goal < {GOAL_S:g} s), "
                     f"{'met' if met else 'MISSED'}.")
        per_small = small["ms/round"] / SIZES[0]
        per_big = big["ms/round"] / SIZES[-1]
        ratio = per_big / per_small
        met = ratio <= LINEAR
        verdicts.append((f"rendezvous {backend}: time per node at 4,096 <= {LINEAR:g}x at 200",
                         f"{ratio:.2f}x", met))
        goals.append(f"- {backend}: time per node at 4,096 nodes {ratio:.2f}x that at 200 "
                     f"(goal <= {LINEAR:g}x), {'met' if met else 'MISSED'}.")
        if "requests/node" in small and "requests/node" in big:
            # What each node asks of the backend does not move with the
            # machine's load, where its time does.
            ratio = big["requests/node"] / small["requests/node"]
            met = ratio <= LINEAR_REQUESTS
            verdicts.append((f"rendezvous {backend}: requests per node at 4,096 <= {LINEAR_REQUESTS:g}x at 200",
                             f"{ratio:.2f}x", met))
            goals.append(f"- {backend}: requests per node at 4,096 nodes {ratio:.2f}x those at 200 "
                         f"(goal <= {LINEAR_REQUESTS:g}x), {'met' if met else 'MISSED'}.")
    lines += ["", "Goals:"] + goals
    return lines, verdicts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="rounds per size (Go's -benchtime Nx)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    lines, _ = render(run(args.rounds, args.quick))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

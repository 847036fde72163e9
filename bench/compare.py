"""Side-by-side collective benchmark: gorun's allreduce-perf against torch
1.13's gloo backend and OpenMPI (mpi4py) over shared memory and over TCP,
interleaved round by round on the same machine, reported as medians and
ratios. The machine is shared and noisy: read the ratios, not the figures.

    make build && /usr/bin/python3 bench/compare.py --rounds 3
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.environ.get("GORUN_TEST_PYTHON", "/usr/bin/python3")
GORUN = os.path.join(ROOT, "bin", "gorun")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
ROW = re.compile(r"^(?:\[rank0\]:)?\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")


def tools(world, op):
    """The command line of every contender, for one world size."""
    anchor = [os.path.join(ROOT, "bench", "anchor.py"), "-o", op]
    return {
        "gorun": [GORUN, "--nproc-per-node", str(world), "--local-ranks-filter", "0",
                  os.path.join(ROOT, "bin", "allreduce-perf"), "-o", op, "-c", "0"],
        "gloo": [GORUN, "--nproc-per-node", str(world), "--local-ranks-filter", "0", "--python", PY] + anchor,
        "mpi-shm": MPIRUN + ["-np", str(world), "--mca", "btl", "self,vader", PY] + anchor + ["--mpi"],
        "mpi-tcp": MPIRUN + ["-np", str(world), "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
                             PY] + anchor + ["--mpi"],
    }


def measure(cmd, sizes):
    """Runs cmd over a size range and returns {bytes: (time_us, busbw)}."""
    lo, hi, factor, iters = sizes
    out = subprocess.run(cmd + ["-b", lo, "-e", hi, "-f", factor, "-w", "3", "-n", iters],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    rows = {}
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(4)))
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--op", default="allreduce")
    args = p.parse_args()
    ranges = [("8", "8", "2", "200"), ("1M", "64M", "4", "10")]
    names = ["gorun", "gloo", "mpi-shm", "mpi-tcp"]
    results = {}  # (world, tool, bytes) -> [(time, busbw)]
    for _ in range(args.rounds):
        for world in map(int, args.worlds.split(",")):
            for name, cmd in tools(world, args.op).items():
                for r in ranges:
                    for size, v in measure(cmd, r).items():
                        results.setdefault((world, name, size), []).append(v)
    print(f"# {args.op}, float32, median of {args.rounds} interleaved rounds; busbw in GB/s, latency in us")
    print("| world | size | " + " | ".join(names) + " | gorun/gloo | gorun/mpi-shm | gorun/mpi-tcp |")
    print("|---" * (5 + len(names)) + "|")
    for world in map(int, args.worlds.split(",")):
        for size in sorted({k[2] for k in results if k[0] == world}):
            med = {}
            for name in names:
                vals = results.get((world, name, size))
                if vals:
                    med[name] = statistics.median(v[0] if size <= 8 else v[1] for v in vals)
            label = f"{size} B (us)" if size <= 8 else f"{size >> 20} MiB"

            def ratio(other):
                if other not in med or "gorun" not in med or not med[other] or not med["gorun"]:
                    return "-"
                # Lower latency is better, higher bandwidth is better.
                r = med[other] / med["gorun"] if size <= 8 else med["gorun"] / med[other]
                return f"{r:.2f}x"

            cells = [f"{med[n]:.2f}" if n in med else "-" for n in names]
            print(f"| {world} | {label} | " + " | ".join(cells) +
                  f" | {ratio('gloo')} | {ratio('mpi-shm')} | {ratio('mpi-tcp')} |")


if __name__ == "__main__":
    main()

"""Launcher overhead: the wall time to start 4 workers of /bin/true and see
them all exit, for gorun, OpenMPI's mpirun and torch 1.13's torchrun, timed
by hyperfine (no shell, -N) and compared by median.

torchrun spends most of its ~6 s sleeping in its 5-second monitor loop, so
it gets fewer runs. Debian's torch 1.13 under Python 3.11 crashes parsing
the default --redirects/--tee 0 (Std.from_str returns None); a per-rank map
naming only a rank the job does not have (9:1) means the same thing, no
redirection for ranks 0-3, and parses.

    /usr/bin/python3 bench/launcher.py      # this section alone
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

from common import PY, ROOT, log, mpi_env
TARGET = 0.5  # gorun's median at most this fraction of mpirun's


def commands(nproc=4):
    """name -> (command line, warmup runs, timed runs per round)."""
    n = str(nproc)
    return {
        "gorun": (shlex.join([os.path.join(ROOT, "bin", "gorun"), "--nproc-per-node", n, "/bin/true"]), 3, 20),
        # --oversubscribe: more workers than this machine may have cores.
        "mpirun": (shlex.join(["mpirun", "--oversubscribe", "-np", n, "/bin/true"]), 3, 20),
        "torchrun": (shlex.join([PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n,
                                 "--redirects", "9:1", "--tee", "9:1", "--no_python", "/bin/true"]), 1, 3),
    }


def hyperfine(cmd, warmup, runs):
    """Times cmd with hyperfine and returns every run's wall time in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "hyperfine.json")
        argv = ["hyperfine", "-N", "-w", str(warmup), "-r", str(runs), "--export-json", out, cmd]
        proc = subprocess.run(argv, capture_output=True, text=True, env=mpi_env(), timeout=600)
        if proc.returncode != 0:
            sys.exit(f"launcher: {' '.join(argv)} failed (a run exited non-zero?):\n{proc.stdout}\n{proc.stderr}")
        with open(out) as f:
            return json.load(f)["results"][0]["times"]


def run(rounds, quick=False, skip_torchrun=False):
    """Times every launcher, gorun and mpirun alternating each round;
    returns {name: [seconds per run]}."""
    cmds = commands()
    times = {name: [] for name in cmds}
    for r in range(rounds):
        names = ["gorun", "mpirun"] if r % 2 == 0 else ["mpirun", "gorun"]
        for name in names:
            cmd, warmup, runs = cmds[name]
            times[name] += hyperfine(cmd, warmup, max(runs // 2, 5) if quick else runs)
        log(f"[launcher round {r + 1}/{rounds}] gorun and mpirun done")
    if skip_torchrun:
        del times["torchrun"]
    else:
        cmd, warmup, runs = cmds["torchrun"]
        times["torchrun"] = hyperfine(cmd, warmup, runs)
        log("[launcher] torchrun done")
    return times


def render(times):
    """The markdown table and whether gorun met its target against mpirun."""
    cmds = commands()
    med = {name: statistics.median(t) for name, t in times.items()}
    lines = [
        "### Launcher: 4 workers of /bin/true, wall time (hyperfine -N), median over all runs",
        "",
        "| launcher | command | runs | median (ms) | mean ± sd (ms) | gorun / it |",
        "|---|---|---|---|---|---|",
    ]
    for name, t in times.items():
        sd = statistics.stdev(t) * 1e3 if len(t) > 1 else 0.0
        cmd = cmds[name][0].replace(shlex.quote(os.path.join(ROOT, "bin", "gorun")), "bin/gorun")
        lines.append(f"| {name} | `{cmd}` | {len(t)} | {med[name] * 1e3:.1f} | "
                     f"{statistics.mean(t) * 1e3:.1f} ± {sd:.1f} | {med['gorun'] / med[name]:.2f}x |")
    ratio = med["gorun"] / med["mpirun"]
    met = ratio <= TARGET
    verdict = "met" if met else "MISSED"
    lines += ["", f"Target gorun <= {TARGET}x mpirun: {ratio:.2f}x, {verdict}."]
    return lines, [("launcher: gorun --nproc-per-node 4 /bin/true <= 0.5x mpirun -np 4", f"{ratio:.2f}x", met)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--skip-torchrun", action="store_true", help="leave out torchrun (about 30 s)")
    args = p.parse_args()
    lines, _ = render(run(args.rounds, args.quick, args.skip_torchrun))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

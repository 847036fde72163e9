"""make bench-compare: gorun against torch 1.13 (gloo, torchrun, TCPStore)
and OpenMPI 4.1 (mpi4py over shared memory and over TCP, mpirun) on one
host, in one run, printed as markdown with gorun's ratio to each and the
issue's targets marked met or missed:

  collectives  all_reduce, broadcast, all_gather, reduce_scatter and
               all_to_all at 8 B, 64 KiB, 1 MiB, 16 MiB and 64 MiB, world 2
               and 4 (bench/collectives.py says exactly how each system is
               measured, and checks they all agree)
  links        the same collectives between 2 and 4 emulated hosts
               (network namespaces, 2 ranks each, links shaped to 2 Gbit/s
               by tc tbf): gorun's automatic choice and every algorithm
               GORUN_ALGO forces, Open MPI over TCP and gloo, against the
               link's bound (bench/links.py; root)
  launcher     4 workers of /bin/true under gorun, mpirun and torchrun,
               timed by hyperfine (bench/launcher.py)
  store        set/get/add ops/s of torch's TCPStore clients against
               torch's server and gorun's (bench/store.py)
  scale        cluster scale, one part per script: the store under 1K to
               16K simulated ranks against torch's server (scale_store.py),
               rendezvous rounds of 200 to 4,096 nodes (scale_rdzv.py),
               64 and 128 sshd hosts against mpirun (scale_ssh.py, root)
               and 256 workers on one node against torchrun
               (scale_wide.py)

Beside --out (FILE.md) go the figures: FILE-collectives-OP.png and
FILE-links-OP.png, bus bandwidth against size, a line per system
(bench/plot.py; python3-matplotlib).

The machine is shared and noisy: read the ratios, which come from the same
run, rather than the figures. Progress goes to stderr, the tables to
stdout (and to --out). Every missing tool stops the run before it starts,
naming its Debian package. The full run takes 10 to 15 minutes on 2 cores,
and the links section as long again per round (16 minutes for one round
of 3 sizes with the machine at load 30: every host's ranks share the
cores).

    make bench-compare
    /usr/bin/python3 bench/compare.py --quick
    /usr/bin/python3 bench/compare.py --sections collectives --ops allreduce --sizes 1M,16M --worlds 4
"""
import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time

# The sections, beside this file (a script's own folder is on sys.path);
# no __pycache__ left in the working tree.
sys.dont_write_bytecode = True
import collectives  # noqa: E402
import launcher  # noqa: E402
import links  # noqa: E402
import plot  # noqa: E402
import store  # noqa: E402
from common import PY, ROOT, log  # noqa: E402

SECTIONS = ("collectives", "links", "launcher", "store", "scale")
SCALE_PARTS = ("store", "rdzv", "ssh", "wide")


def scale_module(part):
    """bench/scale_PART.py: run(rounds, quick) and render(result), as
    launcher.py has; check_tools(), where it has one, exits naming what
    this machine lacks."""
    return importlib.import_module("scale_" + part)


def missing(sections):
    """Everything the chosen sections need and this machine lacks, each
    naming what to install or build."""
    needs = []
    bins = {"gorun": "make build", "allreduce-perf": "make build", "storeserver": "go build -o bin/ ./bench/storeserver"}
    wanted = {"gorun"} | ({"allreduce-perf"} if {"collectives", "links"} & set(sections) else set()) | \
        ({"storeserver"} if {"store", "scale"} & set(sections) else set())
    for name in sorted(wanted):
        if not os.access(os.path.join(ROOT, "bin", name), os.X_OK):
            needs.append(f"bin/{name} is not built: run {bins[name]}")
    tools = {}
    if {"collectives", "links"} & set(sections):
        tools.update(mpirun="openmpi-bin", ompi_info="openmpi-bin")
    if "links" in sections:
        tools.update(ip="iproute2", tc="iproute2", unshare="util-linux")
        if os.geteuid() != 0:
            needs.append("the links section needs root (network namespaces, tc): run as root or leave it out")
    if "launcher" in sections:
        tools.update(mpirun="openmpi-bin", hyperfine="hyperfine")
    for tool, package in sorted(tools.items()):
        if shutil.which(tool) is None:
            needs.append(f"{tool} is not on PATH: apt-get install {package}")
    modules = {"torch": "python3-torch"}
    if {"collectives", "links"} & set(sections):
        modules.update(mpi4py="python3-mpi4py", numpy="python3-numpy")
    if not os.access(PY, os.X_OK):
        needs.append(f"{PY} does not exist: apt-get install python3 python3-torch (or set GORUN_BENCH_PYTHON)")
        return needs
    for module, package in sorted(modules.items()):
        proc = subprocess.run([PY, "-c", f"import {module}"], capture_output=True, text=True)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["no error output"])[-1]
            needs.append(f"{PY} cannot import {module}: apt-get install {package} ({why})")
    if plots_wanted(sections):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            needs.append(f"{sys.executable} cannot import matplotlib (the figures): apt-get install python3-matplotlib")
    return needs


def plots_wanted(sections):
    return bool({"collectives", "links"} & set(sections))


def first_line(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def machine():
    """One line naming the machine and the software measured."""
    cpu = "unknown CPU"
    mem = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
            mem = f"{kib / (1 << 20):.0f} GiB"
    except (OSError, StopIteration):
        pass
    torch = first_line([PY, "-c", "import torch; print(torch.__version__)"])
    ompi = first_line(["mpirun", "--version"])
    return (f"{os.cpu_count()} cores ({cpu}), {mem}, {platform.system()} {platform.release()}; "
            f"torch {torch}, {ompi}, load average {os.getloadavg()[0]:.2f} at start")


def sizes_arg(s):
    return tuple(collectives.parse_size(v) for v in s.split(","))


def list_arg(choices):
    def parse(s):
        values = tuple(v.strip() for v in s.split(","))
        bad = [v for v in values if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{','.join(bad)}: want some of {','.join(choices)}")
        return values
    return parse


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, help="interleaved rounds, medians over them (default 5, 1 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="one round, sizes 8,1M,16M, half the iterations, no torchrun: a few minutes")
    p.add_argument("--sections", type=list_arg(SECTIONS), default=SECTIONS, help="some of " + ",".join(SECTIONS))
    p.add_argument("--ops", type=list_arg(collectives.OPS), default=collectives.OPS,
                   help="collectives, some of " + ",".join(collectives.OPS))
    p.add_argument("--sizes", type=sizes_arg, help="bytes, K/M/G suffixes (default 8,64K,1M,16M,64M)")
    p.add_argument("--worlds", type=lambda s: tuple(int(v) for v in s.split(",")), default=collectives.WORLDS)
    p.add_argument("--scale-parts", type=list_arg(SCALE_PARTS), default=SCALE_PARTS,
                   help="parts of the scale section, some of " + ",".join(SCALE_PARTS))
    p.add_argument("--hosts", type=lambda s: tuple(int(v) for v in s.split(",")), default=links.HOSTS,
                   help="emulated host counts of the links section, of 2,4 (default both)")
    p.add_argument("--rate", default=links.RATE, help="links section: each link's rate, as tc reads it (default 2gbit)")
    p.add_argument("--out", help="also write the tables to this file, and the figures beside it")
    p.add_argument("--json", help="write every round's raw figures to this file")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    sizes = args.sizes or ((8, 1 << 20, 16 << 20) if args.quick else collectives.SIZES)

    needs = missing(args.sections)
    if needs:
        sys.exit("bench-compare: cannot run:\n  " + "\n  ".join(needs))
    if "scale" in args.sections:
        for part in args.scale_parts:
            getattr(scale_module(part), "check_tools", lambda: None)()

    began = time.monotonic()
    lines = [f"## gorun vs torch 1.13 and OpenMPI, {datetime.date.today().isoformat()}", "",
             f"Machine: {machine()}.", ""]
    verdicts, raw = [], {}
    if "collectives" in args.sections:
        times, unsupported = collectives.run(args.ops, sizes, args.worlds, rounds, args.quick)
        table = collectives.Table(times, unsupported)
        lines += table.render(args.ops, sizes, args.worlds, rounds) + [""]
        verdicts += table.verdicts
        raw["collectives"] = table.raw()
    if "links" in args.sections:
        # Each links round runs every system on every host count: a few
        # minutes; three rounds at most.
        result = links.run(min(rounds, 3), args.quick, args.hosts, args.ops, args.sizes, args.rate)
        link_lines, link_verdicts = links.render(result)
        lines += link_lines + [""]
        verdicts += link_verdicts
        raw["links"] = result
    if "launcher" in args.sections:
        launch_times = launcher.run(rounds, args.quick, skip_torchrun=args.quick)
        launch_lines, launch_verdicts = launcher.render(launch_times)
        lines += launch_lines + [""]
        verdicts += launch_verdicts
        raw["launcher_seconds"] = launch_times
    if "store" in args.sections:
        rates = store.run(rounds, args.quick)
        lines += store.render(rates, rounds) + [""]
        raw["store_ops_per_s"] = [{"server": s, "op": op, "clients": c, "rounds": r}
                                  for (s, op, c), r in sorted(rates.items())]

    if "scale" in args.sections:
        raw["scale"] = {}
        for part in args.scale_parts:
            module = scale_module(part)
            # Each scale round is minutes long (mpirun over 128 sshd).
            result = module.run(min(rounds, 2), args.quick)
            part_lines, part_verdicts = module.render(result)
            lines += part_lines + [""]
            verdicts += part_verdicts
            raw["scale"][part] = result

    missed = [v for v in verdicts if not v[2]]
    lines.append(f"### Targets: {len(verdicts) - len(missed)} of {len(verdicts)} met")
    lines += [""] + [f"- MISSED {what}: {ratio}" for what, ratio, _ in missed]
    lines.append(f"\n(bench-compare took {time.monotonic() - began:.0f} s; "
                 f"load average {os.getloadavg()[0]:.2f} at the end)")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    if args.out and plots_wanted(args.sections):
        out_dir, stem = os.path.split(os.path.splitext(os.path.abspath(args.out))[0])
        figures = []
        if "collectives" in raw:
            figures += plot.plot_collectives(raw["collectives"], out_dir, stem)
        if "links" in raw:
            figures += plot.plot_links(raw["links"], out_dir, stem)
        log("bench-compare: figures " + ", ".join(os.path.relpath(f) for f in figures))
    if args.strict and missed:
        sys.exit(1)


if __name__ == "__main__":
    main()

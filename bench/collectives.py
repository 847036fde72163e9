"""Collectives, side by side: gorun's allreduce-perf (shared-memory/auto
transport, and forced to TCP) against torch 1.13's gloo backend and OpenMPI
through mpi4py (shared memory, and TCP over loopback), for every collective,
size and world size, interleaved: each round runs every (world, collective)
on every system, the systems in an order rotated round by round, so drift
on a shared machine lands on all of them alike.

The systems:
- gorun, gorun-tcp: bin/allreduce-perf under bin/gorun, GORUN_TRANSPORT=auto
  (shared memory within a host) or tcp.
- gloo: bench/anchor.py under bin/gorun (the launcher plays no part in the
  timed loop).
- mpi-shm, mpi-tcp: bench/anchor.py --mpi under mpirun --oversubscribe
  --mca pml ob1, with --mca btl self,vader (self,sm from OpenMPI 5) or
  --mca btl self,tcp --mca btl_tcp_if_include lo.
- Every system runs both unbound (the default of gorun, torchrun and most
  users: the kernel places the ranks and may move them) and bound, every
  rank to one core, the same way: gorun --bind-to core and mpirun --bind-to
  core:overload-allowed both put rank i on core i mod cores (unbound is
  gorun's default and mpirun --bind-to none). Unbound figures vary more:
  the ranks of an oversubscribed world land wherever the scheduler puts
  them, which is luck (OpenMPI's TCP all_reduce of 4 ranks on 2 cores took
  25 to 34 ms at 16 MiB by placement alone); medians over rounds tame it.

How every system is measured (allreduce-perf, and bench/anchor.py for gloo
and MPI, print the same rows; this file checks they agree):
- float32. SIZE is nccl-tests' "size" column: the whole buffer, that is the
  all_reduce/broadcast buffer, the all_gather output, the reduce_scatter
  input, and one rank's all_to_all send buffer; each rank passes SIZE/world
  elements to all_gather, gets SIZE/world from reduce_scatter, and sends
  SIZE/world to each peer in all_to_all. For those three SIZE is rounded
  down to a multiple of the world size, at least one element per rank (so
  "8 B" is 16 B at world 4).
- Each rank runs w warmup calls, a barrier, then n timed calls; the time is
  the slowest rank's mean per call. algbw = SIZE / time; busbw = algbw times
  nccl-tests' factor: all_reduce 2(n-1)/n, broadcast 1, all_gather,
  reduce_scatter and all_to_all (n-1)/n.
- 8-byte rows are latencies (us); every other row is busbw (GB/s). Ratios
  are gorun's advantage: bandwidth ours/theirs, latency theirs/ours, so
  above 1x means gorun is faster.
- Each figure is the median over rounds of the time, busbw derived from it.
"""
import os
import re
import statistics
import subprocess
import sys
import time

from common import BUS_FACTOR, PER_RANK, PY, ROOT, elements, log, mpi_env, parse_size

GORUN = os.path.join(ROOT, "bin", "gorun")

OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall")
SIZES = (8, 64 << 10, 1 << 20, 16 << 20, 64 << 20)
WORLDS = (2, 4)
SYSTEMS = ("gorun", "gorun-tcp", "gloo", "mpi-shm", "mpi-tcp")
# How the ranks are placed: the kernel's choice, or one core each.
BINDS = ("unbound", "bound")
LATENCY_MAX = 8  # rows at or below this many requested bytes are latencies
# The goal: on one host, bound and unbound, every collective at
# least 1.2x OpenMPI's shared memory from 64 KiB to 64 MiB.
TARGET_SIZES = (64 << 10, 1 << 20, 16 << 20, 64 << 20)
SHM_TARGET = 1.2
# A figure whose rounds differ by more than this factor is marked noisy.
NOISY, NOISY_SPREAD = "~", 2.0

# A result row: size, count, type, redop, root, time, algbw, busbw[, #wrong].
ROW = re.compile(r"^(?:\[rank0\]:)?\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
UNSUPPORTED = re.compile(r"^(?:\[rank0\]:)?\s*# unsupported: (.*)$", re.M)


def iterations(size, quick, system):
    """(warmup, timed) calls for one size: about a second of work for the
    slowest system (gloo), so that a round stays short. On a shared machine
    more rounds beat longer ones: a median over rounds drops the rounds a
    neighbour's burst of load landed on. The smallest sizes take microseconds
    on gorun and OpenMPI, so up to 4 MiB their calls are many more: the
    first few milliseconds of a job run before the kernel has spread its
    ranks over the cores (two spinning ranks sharing one core take turns),
    which 20 calls of 1 us, or 3 of 100 us, do not outlast, but 20 calls of
    gloo's 300 us do. For the same reason their 16 MiB calls (1 to 50 ms)
    number 20, not 6: six calls of a millisecond are shorter than one time
    slice of the scheduler, and read 0.9x or 1.4x by the luck of it."""
    fast = system != "gloo"
    if size <= 4 << 10:
        w, n = (2000, 2000) if fast else (20, 300)
    elif size <= 256 << 10:
        w, n = (200, 300) if fast else (5, 60)
    elif size <= 4 << 20:
        w, n = (30, 150) if fast else (3, 30)
    elif size <= 32 << 20:
        w, n = (5, 20) if fast else (2, 6)
    else:
        w, n = 1, 3
    return (w, max(n // 2, 3)) if quick else (w, n)


def expected(op, size, world):
    """(SIZE in bytes, nccl-tests' count column) for a requested size."""
    count = elements(op, size, world)
    return count * 4, count // world if op in PER_RANK else count


def shm_btl():
    """OpenMPI's shared-memory BTL: vader up to 4.x, sm from 5.0."""
    out = subprocess.run(["ompi_info", "--parsable", "--all"], capture_output=True, text=True).stdout
    for name in ("vader", "sm"):
        if re.search(rf"^mca:btl:{name}:", out, re.M):
            return name
    sys.exit("collectives: this OpenMPI has neither the vader nor the sm BTL (ompi_info lists neither)")


def command(system, op, world, sizes, quick, btl, bind="bound"):
    """(argv, extra environment) of one system for one collective, its
    ranks placed as bind (one of BINDS) says."""
    plan = [iterations(s, quick, system) for s in sizes]
    size_flags = ["-sizes", ",".join(map(str, sizes)),
                  "-w", ",".join(str(w) for w, _ in plan), "-n", ",".join(str(n) for _, n in plan)]
    if bind not in BINDS:
        raise ValueError(bind)
    bound = bind == "bound"
    launch = [GORUN, "--nproc-per-node", str(world), "--local-ranks-filter", "0"] + (["--bind-to", "core"] if bound else [])
    anchor = [PY, os.path.join(ROOT, "bench", "anchor.py"), "-o", op] + size_flags
    # Bound as gorun's ranks are; pml ob1, the only one the --mca btl
    # choice governs (ucx would pick its own way).
    mpirun = ["mpirun", "--oversubscribe", "--bind-to", "core:overload-allowed" if bound else "none",
              "-np", str(world), "--mca", "pml", "ob1"]
    perf = launch + [os.path.join(ROOT, "bin", "allreduce-perf"), "-o", op, "-c", "0"] + size_flags
    if system == "gorun":
        return perf, {"GORUN_TRANSPORT": "auto"}
    if system == "gorun-tcp":
        return perf, {"GORUN_TRANSPORT": "tcp"}
    if system == "gloo":
        return launch + anchor, {}
    if system == "mpi-shm":
        return mpirun + ["--mca", "btl", f"self,{btl}"] + anchor + ["--mpi"], {}
    if system == "mpi-tcp":
        return mpirun + ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"] + anchor + ["--mpi"], {}
    raise ValueError(system)


def measure(system, op, world, sizes, quick, btl, bind="bound"):
    """Runs one system once over sizes; returns [time_us per size], or the
    backend's reason when it lacks the collective."""
    argv, extra = command(system, op, world, sizes, quick, btl, bind)
    proc = subprocess.run(argv, capture_output=True, text=True, env=mpi_env(**extra), timeout=900)
    said = f"{system} {op} world {world} {bind}: {' '.join(argv)}"
    unsupported = UNSUPPORTED.search(proc.stdout)
    if proc.returncode == 0 and unsupported and system == "gloo":
        return unsupported.group(1).strip()
    if proc.returncode != 0:
        sys.exit(f"collectives: {said} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    rows = [m.groups() for m in map(ROW.match, proc.stdout.splitlines()) if m]
    if len(rows) != len(sizes):
        sys.exit(f"collectives: {said} printed {len(rows)} rows for {len(sizes)} sizes:\n{proc.stdout}")
    times = []
    for size, (nbytes, count, time_us, _algbw, busbw) in zip(sizes, rows):
        want_bytes, want_count = expected(op, size, world)
        if (int(nbytes), int(count)) != (want_bytes, want_count):
            sys.exit(f"collectives: {said}: {size} B ran as size {nbytes} count {count}, "
                     f"want size {want_bytes} count {want_count} (nccl-tests' convention)")
        t = float(time_us)
        # Its own busbw must be nccl-tests' formula applied to its size and
        # time, up to the printed rounding.
        ours = want_bytes / (t * 1e-6) / 1e9 * BUS_FACTOR[op](world)
        if abs(ours - float(busbw)) > 0.006 + 0.01 * ours:
            sys.exit(f"collectives: {said}: {size} B reports busbw {busbw} GB/s, "
                     f"but size {want_bytes} B in {t} us gives {ours:.3f} GB/s by nccl-tests' formula")
        times.append(t)
    return times


def run(ops, sizes, worlds, rounds, quick=False, systems=SYSTEMS, binds=BINDS):
    """Every measurement, interleaved (for each world and collective, every
    system unbound and bound, in an order rotated round by round); returns
    ({(system, op, world, size, bind): [time_us per round]}, {(system, op): reason})."""
    btl = shm_btl()
    times, unsupported = {}, {}
    runs = [(s, b) for b in binds for s in systems]
    for r in range(rounds):
        order = runs[r % len(runs):] + runs[:r % len(runs)]
        for world in worlds:
            for op in ops:
                began = time.monotonic()
                for system, bind in order:
                    if (system, op) in unsupported:
                        continue
                    got = measure(system, op, world, sizes, quick, btl, bind)
                    if isinstance(got, str):
                        unsupported[(system, op)] = got
                        continue
                    for size, t in zip(sizes, got):
                        times.setdefault((system, op, world, size, bind), []).append(t)
                log(f"[collectives round {r + 1}/{rounds}] world {world} {op}: {time.monotonic() - began:.0f} s")
    return times, unsupported


def label(size):
    if size >= 1 << 20:
        return f"{size >> 20} MiB"
    if size >= 1 << 10:
        return f"{size >> 10} KiB"
    return f"{size} B"


class Table:
    """Median figures and gorun's ratios, per collective, world, size and
    placement (bind)."""

    def __init__(self, times, unsupported):
        self.times, self.unsupported = times, unsupported
        self.verdicts = []  # (target, ratio text, met)
        self.binds = [b for b in BINDS if any(k[4] == b for k in times)] or ["bound"]

    def value(self, system, op, world, size, bind="bound"):
        """busbw (GB/s) or, for latency rows, time (us); None if not run."""
        t = self.times.get((system, op, world, size, bind))
        if not t:
            return None
        med = statistics.median(t)
        if size <= LATENCY_MAX:
            return med
        nbytes, _ = expected(op, size, world)
        return nbytes / (med * 1e-6) / 1e9 * BUS_FACTOR[op](world)

    def ratio(self, ours, other, op, world, size, bind="bound"):
        """gorun's advantage of system ours over system other, or None."""
        a, b = self.value(ours, op, world, size, bind), self.value(other, op, world, size, bind)
        if not a or not b:
            return None
        return b / a if size <= LATENCY_MAX else a / b

    def check(self, what, ours, other, op, world, size, at_least, bind="bound"):
        """Records one target; returns its cell text."""
        r = self.ratio(ours, other, op, world, size, bind)
        if r is None:
            return f"{other}: not run"
        met = r >= at_least
        self.verdicts.append((f"{what}, {op}, world {world}, {label(size)}, {bind}",
                              f"{r:.2f}x (need {at_least:.2f}x)", met))
        return f"{other} {'met' if met else 'MISSED'} ({r:.2f}x, need {at_least:.2f}x)"

    def cell(self, system, op, world, size, bind="bound"):
        v = self.value(system, op, world, size, bind)
        if v is None:
            return "n/a" if (system, op) in self.unsupported else "-"
        text = f"{v:.1f}" if size <= LATENCY_MAX else f"{v:.2f}"
        t = self.times[(system, op, world, size, bind)]
        return text + NOISY if max(t) > NOISY_SPREAD * min(t) else text

    def ratio_cell(self, ours, other, op, world, size, bind="bound"):
        r = self.ratio(ours, other, op, world, size, bind)
        if r is not None:
            return f"{r:.2f}x"
        return "n/a" if (other, op) in self.unsupported else "-"

    def main_targets(self, op, world, size, bind="bound"):
        """The issues' targets for the default (auto) transport."""
        cells = []
        if size <= LATENCY_MAX and op == "allreduce":
            cells.append(self.check("latency <= 2x OpenMPI shm", "gorun", "mpi-shm", op, world, size, 0.5, bind))
        elif size in TARGET_SIZES:
            cells.append(self.check(f"busbw >= {SHM_TARGET:g}x OpenMPI shm", "gorun", "mpi-shm", op, world, size,
                                    SHM_TARGET, bind))
            if op == "allreduce" and size in (1 << 20, 16 << 20):
                cells.append(self.check("busbw >= 3x gloo", "gorun", "gloo", op, world, size, 3.0, bind))
        return "; ".join(cells)

    def tcp_targets(self, op, world, size, bind="bound"):
        """The issue's targets with gorun forced to TCP (all_reduce only)."""
        if op != "allreduce":
            return ""
        if size <= LATENCY_MAX:
            return self.check("TCP latency <= 1.5x OpenMPI TCP", "gorun-tcp", "mpi-tcp", op, world, size, 1 / 1.5, bind)
        if size in (1 << 20, 16 << 20):
            return self.check("TCP busbw >= 1x OpenMPI TCP", "gorun-tcp", "mpi-tcp", op, world, size, 1.0, bind)
        return ""

    def render(self, ops, sizes, worlds, rounds):
        lines = [
            f"### Collectives: float32, median of {rounds} interleaved rounds; "
            "busbw in GB/s (nccl-tests' formulas), 8-byte rows are latency in us; "
            "ranks unbound (gorun's default, `mpirun --bind-to none`) and bound one per core",
            "",
            "| collective | world | size | ranks | gorun | gloo | mpi-shm | mpi-tcp "
            "| gorun/gloo | gorun/mpi-shm | gorun/mpi-tcp | targets |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for op in ops:
            for world in worlds:
                for size in sizes:
                    unit = " (us)" if size <= LATENCY_MAX else ""
                    shown, _ = expected(op, size, world)
                    for bind in self.binds:
                        values = [self.cell(s, op, world, size, bind) for s in ("gorun", "gloo", "mpi-shm", "mpi-tcp")]
                        ratios = [self.ratio_cell("gorun", s, op, world, size, bind) for s in ("gloo", "mpi-shm", "mpi-tcp")]
                        lines.append(f"| {op} | {world} | {label(shown)}{unit} | {bind} | " + " | ".join(values + ratios) +
                                     f" | {self.main_targets(op, world, size, bind)} |")
        lines += [
            "",
            "### Collectives, gorun forced to TCP (`GORUN_TRANSPORT=tcp`) against OpenMPI over TCP "
            "(`--mca btl self,tcp --mca btl_tcp_if_include lo`)",
            "",
            "| collective | world | size | ranks | gorun-tcp | mpi-tcp | gorun-tcp/mpi-tcp | gorun-tcp/gorun | targets |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for op in ops:
            for world in worlds:
                for size in sizes:
                    unit = " (us)" if size <= LATENCY_MAX else ""
                    shown, _ = expected(op, size, world)
                    for bind in self.binds:
                        lines.append(
                            f"| {op} | {world} | {label(shown)}{unit} | {bind} | "
                            f"{self.cell('gorun-tcp', op, world, size, bind)} | "
                            f"{self.cell('mpi-tcp', op, world, size, bind)} | "
                            f"{self.ratio_cell('gorun-tcp', 'mpi-tcp', op, world, size, bind)} | "
                            f"{self.ratio_cell('gorun-tcp', 'gorun', op, world, size, bind)} | "
                            f"{self.tcp_targets(op, world, size, bind)} |")
        lines += ["", f"{NOISY}: its rounds differ by more than {NOISY_SPREAD:g}x (a busy machine); "
                  "the median still stands, but read it with care."]
        notes = sorted({f"{s} has no {op}: {why}" for (s, op), why in self.unsupported.items()})
        if notes:
            lines += [""] + [f"n/a: {n}" for n in notes]
        return lines

    def raw(self):
        """Every round's time (us), for --json."""
        return [{"system": s, "op": op, "world": w, "size": size, "bind": b, "time_us": t}
                for (s, op, w, size, b), t in sorted(self.times.items())]

"""Wide nodes: 256 workers on one node, gorun --nproc-per-node 256 against
torch 1.13's torchrun on the same job, with the same worker
(bench/wideworker, a small Go program) under both.

- launch: from the command to the last worker running (each worker writes
  its start time to a file of its own, then waits for SIGTERM);
- stop: from SIGTERM to the launcher until it has exited and every worker
  is gone;
- console: every rank prints LINES lines "rank=R seq=S xxx...", through a
  4 KiB buffer as C stdio does on a pipe, as fast as it can; lines per
  second through the launcher's stdout, from the first line read to the
  last, and every line checked: it arrives whole, exactly once, with the
  prefix of its own rank.

torchrun's default does not prefix lines: the workers inherit its stdout,
and their 4 KiB writes cut lines in two wherever two ranks write at once.
To compare like with like, torchrun runs with --tee 1 (its prefix
"[default<local rank>]:" on every line of stdout, which it tails from the
workers' log files); its default is measured too, as one more row.
Debian's torch 1.13 under Python 3.11 crashes on --tee 3 and on the
default --redirects 0 (Std.from_str finds no member for 0 or 3, and its
maps take one-digit ranks), so the default row redirects rank 0's stderr
alone ("0:2"), which the worker leaves empty. --monitor_interval 1 (5 s by default)
only shortens the wait after the job; Debian's torch 1.13 spells its
flags with underscores.

    /usr/bin/python3 bench/scale_wide.py [--quick]
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from common import PY, ROOT, log

NPROC = 256
PAD = 60          # bytes of padding: a line is about 85 bytes with its prefix
LINES = 2000      # per rank: 512,000 lines, 44 MB
QUICK_LINES = 500
TIMEOUT = 180     # seconds any one job may take
GORUN = os.path.join(ROOT, "bin", "gorun")
WORKER = os.path.join(ROOT, "bin", "wideworker")


def launchers():
    """name -> the command line before the worker's."""
    n = str(NPROC)
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n,
                "--monitor_interval", "1", "--no_python"]
    return {
        "gorun": [GORUN, "--nproc-per-node", n],
        "torchrun --tee 1": torchrun[:-1] + ["--redirects", "1", "--tee", "1", "--no_python"],
        # Stdout as by default: only rank 0's stderr, which the worker
        # leaves empty, is redirected.
        "torchrun (default)": torchrun[:-1] + ["--redirects", "0:2", "--tee", "0:2", "--no_python"],
    }


def check_tools():
    """Stops naming what to install or build."""
    for path, how in [(GORUN, "make build"), (WORKER, "go build -o bin/ ./bench/wideworker")]:
        if not os.access(path, os.X_OK):
            sys.exit(f"scale_wide: {path} is missing: {how}")
    if not os.path.exists(PY):
        sys.exit(f"scale_wide: {PY} does not exist: apt-get install python3 python3-torch")
    proc = subprocess.run([PY, "-c", "import torch.distributed.run"], capture_output=True)
    if proc.returncode != 0:
        sys.exit(f"scale_wide: {PY} cannot import torch.distributed.run: apt-get install python3-torch")


def gone(pid):
    """Whether pid has exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def ready_ranks(folder):
    """The ranks that have said they run (a name starting with a dot is one
    being written)."""
    return [n for n in os.listdir(folder) if n.isdigit()]


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"scale_wide: {what} within {timeout} s")
        time.sleep(0.002)


def launch_and_stop(name):
    """One job of ready workers: (launch seconds, stop seconds)."""
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "launcher.err"), "w+") as err:
        ready = os.path.join(tmp, "ready")
        os.mkdir(ready)
        argv = launchers()[name] + [WORKER, "ready", ready]
        began = time.time()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=tmp)
        try:
            wait_until(lambda: len(ready_ranks(ready)) == NPROC or proc.poll() is not None, TIMEOUT,
                       f"{name}: {NPROC} workers not ready")
            if proc.poll() is not None:
                err.seek(0)
                raise RuntimeError(f"scale_wide: {name} exited {proc.returncode}:\n{err.read()[-2000:]}")
            pids, stamps = [], []
            for rank in ready_ranks(ready):
                with open(os.path.join(ready, rank)) as f:
                    pid, ns = f.read().split()
                pids.append(int(pid))
                stamps.append(int(ns) / 1e9)
            launch = max(stamps) - began
            stopping = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=TIMEOUT)
            wait_until(lambda: all(gone(p) for p in pids), TIMEOUT, f"{name}: workers outlived the launcher")
            stop = time.monotonic() - stopping
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return launch, stop


LINE = re.compile(rb"\[(?:rank|default)(\d+)\]: ?rank=(\d+) seq=(\d+) (x*)")
BARE = re.compile(rb"rank=(\d+) seq=(\d+) (x*)")


def check_lines(data, lines, prefixed):
    """(whole lines, lost, broken): broken counts every line that is not
    exactly one whole line of its own rank, and every duplicate."""
    seen = set()
    broken = 0
    pattern = LINE if prefixed else BARE
    for line in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
        m = pattern.fullmatch(line)
        if m is None:
            broken += 1
            continue
        if prefixed:
            rank, own, seq, pad = m.groups()
            if rank != own:
                broken += 1
                continue
        else:
            own, seq, pad = m.groups()
        key = (int(own), int(seq))
        if len(pad) != PAD or key in seen or key[1] >= lines or key[0] >= NPROC:
            broken += 1
            continue
        seen.add(key)
    return len(seen), NPROC * lines - len(seen), broken


def console(name, lines):
    """One job of printing workers: (lines/s, whole, lost, broken). The
    workers print once all are running (they wait for the end of a FIFO
    the benchmark holds open), so the rate is the console's, from that
    moment to the last line read."""
    with tempfile.TemporaryDirectory() as tmp, open(os.path.join(tmp, "launcher.err"), "w+") as err:
        ready = os.path.join(tmp, "ready")
        os.mkdir(ready)
        fifo = os.path.join(ready, "go")
        os.mkfifo(fifo)
        hold = os.open(fifo, os.O_RDWR)  # the workers' opens return at once; closing it starts them
        argv = launchers()[name] + [WORKER, "print", str(lines), str(PAD), ready]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, cwd=tmp)
        try:
            wait_until(lambda: len(ready_ranks(ready)) == NPROC or proc.poll() is not None, TIMEOUT,
                       f"{name}: {NPROC} workers not ready")
            began = time.monotonic()
            os.close(hold)
            hold = None
            fd = proc.stdout.fileno()
            chunks, last = [], began
            deadline = began + TIMEOUT
            while time.monotonic() < deadline:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                last = time.monotonic()
                chunks.append(chunk)
        finally:
            if hold is not None:
                os.close(hold)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"scale_wide: {name} exited {proc.returncode}:\n{err.read()[-2000:]}")
    whole, lost, broken = check_lines(b"".join(chunks), lines, name != "torchrun (default)")
    return whole / (last - began), whole, lost, broken


def run(rounds, quick=False):
    """Every launcher once a round, in turns: {name: {metric: [per round]}}."""
    check_tools()
    lines = QUICK_LINES if quick else LINES
    names = list(launchers())
    result = {"lines": lines, "nproc": NPROC, "by": {n: {"launch": [], "stop": [], "rate": [], "whole": [],
                                                            "lost": [], "broken": []} for n in names}}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            by = result["by"][name]
            if name != "torchrun (default)":  # the same start and stop as --tee 1
                launch, stop = launch_and_stop(name)
                by["launch"].append(launch)
                by["stop"].append(stop)
            rate, whole, lost, broken = console(name, lines)
            by["rate"].append(rate)
            by["whole"].append(whole)
            by["lost"].append(lost)
            by["broken"].append(broken)
        log(f"[scale_wide round {r + 1}/{rounds}] done")
    return result


def render(result):
    """The markdown table and the verdicts: gorun starts and stops faster
    than torchrun, prints at least as many lines per second, and loses or
    breaks no line."""
    by, n, lines = result["by"], result["nproc"], result["lines"]
    med = {name: {k: statistics.median(v) if v else None for k, v in m.items() if k in ("launch", "stop", "rate")}
           for name, m in by.items()}
    g, t = med["gorun"], med["torchrun --tee 1"]
    rounds = len(by["gorun"]["rate"])
    lines_out = [
        f"### Scale: wide node, {n} workers on one node, median of {rounds} rounds",
        "",
        f"Launch: command to every worker running; stop: SIGTERM to the launcher until it and every worker are "
        f"gone; console: {n} ranks x {lines:,} lines of {PAD + 25} bytes, lines/s through the launcher's stdout, "
        f"each line checked whole, once, with its own rank's prefix.",
        "",
        "| launcher | launch (s) | stop (s) | console (lines/s) | lines whole | lost | broken or duplicated |",
        "|---|---|---|---|---|---|---|",
    ]

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for name, m in by.items():
        lines_out.append(f"| {name} | {fmt(med[name]['launch'], '.2f')} | {fmt(med[name]['stop'], '.2f')} | "
                         f"{fmt(med[name]['rate'], ',.0f')} | {sum(m['whole']):,} | {sum(m['lost']):,} | "
                         f"{sum(m['broken']):,} |")
    launch_ratio = g["launch"] / t["launch"]
    stop_ratio = g["stop"] / t["stop"]
    rate_ratio = g["rate"] / t["rate"]
    clean = sum(by["gorun"]["lost"]) == 0 and sum(by["gorun"]["broken"]) == 0
    verdicts = [
        (f"wide: gorun launches {n} workers faster than torchrun", f"{launch_ratio:.2f}x", launch_ratio < 1),
        (f"wide: gorun stops {n} workers faster than torchrun", f"{stop_ratio:.2f}x", stop_ratio < 1),
        (f"wide: gorun's console at least torchrun --tee 1's lines/s", f"{rate_ratio:.2f}x", rate_ratio >= 1),
        ("wide: gorun loses, breaks or duplicates no line",
         f"{sum(by['gorun']['lost'])} lost, {sum(by['gorun']['broken'])} broken", clean),
    ]
    lines_out.append("")
    for what, ratio, met in verdicts:
        lines_out.append(f"Goal {what}: {ratio}, {'met' if met else 'MISSED'}.")
    return lines_out, verdicts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1, help="torchrun takes 30-60 s to start 256 workers here")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    lines, _ = render(run(1 if args.quick else args.rounds, args.quick))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

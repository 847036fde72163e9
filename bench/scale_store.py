"""Scale: a store for many ranks. bin/storesim opens one connection per
simulated rank and runs torch's init pattern on it (connect; VALIDATE and
PING in torch 2.x's dialect, nothing in torch 1.13's; ADD init/; a barrier,
ADD then WAIT; WAIT and GET of rank 0's key) against gorun's store
(bin/storeserver) and torch 1.13's own TCPStore server (bench/store.py
--serve-torch), a fresh server for every run, interleaved, at 1K, 4K and
16K ranks, then gorun's alone as far as one process's 20,000 files allow.
torch 1.13's server speaks only its own dialect; gorun's serves both.
A third server, bin/storefloor, is the floor: the least a server can do
for this pattern (one thread, one epoll set, a map; no limits, no
authentication, torch 1.13's dialect only). Its CPU time is what the
kernel and the protocol cost here, whatever the server.

It reports the time to all ranks connected (hello included) and to the
barrier done, the server's CPU time (steadier than wall time on a busy
machine), its resident memory once every rank sits idle, per connection
over what it held before, and the ranks that failed, by kind. A run that
cannot complete (a rank reset, say) stops at the first failure: the
barrier then never ends.

    /usr/bin/python3 bench/scale_store.py [--quick] [--rounds N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from common import PY, ROOT, log

SIZES = (1000, 4000, 16000)
QUICK_SIZES = (1000, 4000)
# Beyond 16K, gorun's server alone (torch's reset every connection at 16K):
# the store's MaxConns lifted and its descriptor reserve cut to 64, so that
# 19,000 connections fit the 20,000 files of its process.
BEYOND = 19000
CASES = (("gorun", "2"), ("gorun", "1.13"), ("torch", "1.13"), ("floor", "1.13"))

TARGET_16K_S = 0.8   # 16K ranks through the barrier, gorun
TARGET_RATIO_4K = 8  # torch's time over gorun's at 4K ranks
TARGET_KIB_PER_CONN = 8

STORESERVER = os.path.join(ROOT, "bin", "storeserver")
STORESIM = os.path.join(ROOT, "bin", "storesim")
STOREFLOOR = os.path.join(ROOT, "bin", "storefloor")


def check_tools():
    for path in (STORESERVER, STORESIM, STOREFLOOR):
        if not os.access(path, os.X_OK):
            sys.exit(f"scale_store: {os.path.relpath(path, ROOT)} is missing: build it with "
                     "'go build -o bin/ ./bench/storeserver ./bench/storesim ./bench/storefloor' (make bench-compare does)")
    probe = subprocess.run([PY, "-c", "import torch.distributed"], capture_output=True)
    if probe.returncode != 0:
        sys.exit("scale_store: torch is missing for the TCPStore server to compare with: "
                 "install the Debian package python3-torch")


def server_cmd(server, ranks):
    if server == "torch":
        return [PY, os.path.join(ROOT, "bench", "store.py"), "--serve-torch"]
    if server == "floor":
        return [STOREFLOOR]
    cmd = [STORESERVER, "-addr", "127.0.0.1:0"]
    if ranks > 16000:
        cmd += ["-max-conns", "-1", "-fd-reserve", "64"]
    return cmd


def one(server, dialect, ranks):
    """Runs storesim once against a fresh server; returns its report."""
    proc = subprocess.Popen(server_cmd(server, ranks), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            sys.exit(f"scale_store: the {server} server did not say where it listens; it printed {line!r}")
        port = line.rsplit(":", 1)[1].strip()
        timeout = 20 if ranks <= 4000 else 40
        sim = subprocess.run([STORESIM, "-addr", f"127.0.0.1:{port}", "-ranks", str(ranks), "-dialect", dialect,
                              "-server-pid", str(proc.pid), "-timeout", f"{timeout}s", "-settle", "1s"],
                             capture_output=True, text=True, timeout=timeout + 60)
        if sim.returncode != 0:
            sys.exit(f"scale_store: storesim failed against {server} at {ranks} ranks: {sim.stderr.strip()}")
        report = json.loads(sim.stdout)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    report["server"] = server
    log(f"[scale store] {server} {dialect} {ranks}: connected {report['connected_s']:.2f} s, "
        f"barrier {report['barrier_s']:.2f} s, errors {report['errors'] or 'none'}")
    return report


def run(rounds=1, quick=False):
    """Every case at every size, rotated round by round; returns the
    reports of all runs."""
    check_tools()
    sizes = QUICK_SIZES if quick else SIZES
    reports = []
    for r in range(rounds):
        for ranks in sizes:
            cases = CASES[r % len(CASES):] + CASES[:r % len(CASES)]
            for server, dialect in cases:
                reports.append(one(server, dialect, ranks))
    if not quick:
        for dialect in ("2", "1.13"):
            reports.append(one("gorun", dialect, BEYOND))
    return reports


def summarise(reports):
    """(ranks, dialect, server) -> the medians of its runs."""
    groups = {}
    for rep in reports:
        groups.setdefault((rep["ranks"], rep["dialect"], rep["server"]), []).append(rep)
    out = {}
    for key, reps in groups.items():
        ok = [r for r in reps if r["done"] == r["ranks"]]
        errors = {}
        for r in reps:
            for kind, n in r["errors"].items():
                errors[kind] = errors.get(kind, 0) + n
        per_conn = [(r["server_rss_kib_idle"] - r["server_rss_kib_before"]) / r["ranks"] for r in ok]
        out[key] = {
            "runs": len(reps),
            "ok": len(ok),
            "connected": statistics.median([r["connected_s"] for r in ok]) if ok else None,
            "barrier": statistics.median([r["barrier_s"] for r in ok]) if ok else None,
            "cpu": statistics.median([r.get("server_cpu_s", 0) for r in reps]),
            "rss_mib": statistics.median([r["server_rss_kib_idle"] for r in reps]) / 1024,
            "kib_per_conn": statistics.median(per_conn) if per_conn else None,
            "errors": errors,
        }
    return out


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def render(reports):
    """The markdown table and the three goals' verdicts."""
    s = summarise(reports)
    lines = [
        "### Scale: store, N simulated ranks through torch's init pattern (one connection each), fresh server per run",
        "",
        "| ranks | dialect | server | all connected (s) | barrier done (s) | server CPU (s) | server RSS (MiB) | RSS per conn (KiB) | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (ranks, dialect, server), v in sorted(s.items()):
        errors = ", ".join(f"{k} {n}" for k, n in sorted(v["errors"].items())) or "none"
        lines.append(f"| {ranks:,} | {dialect} | {server} | {fmt(v['connected'], '.2f')} | {fmt(v['barrier'], '.2f')} | "
                     f"{v['cpu']:.2f} | {v['rss_mib']:.0f} | {fmt(v['kib_per_conn'], '.1f')} | {errors} |")

    verdicts = []
    big = max(r for r, _, srv in s if srv == "gorun" and r <= 16000)
    times = [s[(big, d, "gorun")]["barrier"] for d in ("2", "1.13") if (big, d, "gorun") in s]
    worst = None if None in times or not times else max(times)
    verdicts.append((f"store: {big:,} ranks through init and barrier <= {TARGET_16K_S} s (gorun, slower dialect)",
                     fmt(worst, ".2f") + " s", worst is not None and worst <= TARGET_16K_S))
    ours, theirs = s.get((4000, "1.13", "gorun")), s.get((4000, "1.13", "torch"))
    ratio = None
    if ours and theirs and ours["barrier"] and theirs["barrier"]:
        ratio = theirs["barrier"] / ours["barrier"]
    verdicts.append((f"store: >= {TARGET_RATIO_4K}x faster than torch 1.13's server at 4,000 ranks (1.13 dialect)",
                     fmt(ratio, ".1f") + "x", ratio is not None and ratio >= TARGET_RATIO_4K))
    per_conn = [v["kib_per_conn"] for (r, _, srv), v in s.items() if srv == "gorun" and r == big]
    mem = None if None in per_conn or not per_conn else max(per_conn)
    verdicts.append((f"store: <= {TARGET_KIB_PER_CONN} KiB of server memory per idle connection at {big:,} ranks",
                     fmt(mem, ".1f") + " KiB", mem is not None and mem <= TARGET_KIB_PER_CONN))
    floor = s.get((4000, "1.13", "floor"))
    if ours and theirs and floor and floor["cpu"]:
        lines += ["", f"Server CPU at 4,000 ranks (1.13 dialect) over the floor's: gorun {ours['cpu'] / floor['cpu']:.1f}x, "
                      f"torch {theirs['cpu'] / floor['cpu']:.1f}x. At best, a server here is torch's time over the "
                      f"floor's, {fmt(theirs['barrier'] / floor['barrier'] if floor['barrier'] and theirs['barrier'] else None, '.1f')}x faster than torch's."]
    lines.append("")
    for what, value, met in verdicts:
        lines.append(f"Target {what}: {value}, {'met' if met else 'MISSED'}.")
    return lines, verdicts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="1K and 4K ranks only")
    args = p.parse_args()
    lines, _ = render(run(args.rounds, args.quick))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Bus bandwidth against message size, one figure per collective, one line
per system: the one-host results of bench/collectives.py (a panel per
world size) and the emulated hosts of bench/links.py (a panel per host
count, with the link's bound dashed). Sizes of 8 bytes and less are latencies and
are left out. compare.py calls it for the
figures beside its markdown; on its own it reads their JSON:

    /usr/bin/python3 bench/plot.py compare.json --out-dir DIR [--stem NAME] [--format svg]
    /usr/bin/python3 bench/plot.py links.json --out-dir docs --stem bench

Figures are DIR/STEM-collectives-OP.png and DIR/STEM-links-OP.png. Each
point is the median over rounds of the time, as the tables' figures.
"""
import argparse
import json
import os
import statistics
import sys

sys.dont_write_bytecode = True
from collectives import LATENCY_MAX, expected, label  # noqa: E402
from common import BUS_FACTOR  # noqa: E402

# One look per system across every figure.
STYLE = {
    "gorun": dict(color="C0", marker="o", linewidth=2.2),
    "gorun-tcp": dict(color="C0", marker="o", linestyle="--"),
    "gloo": dict(color="C3", marker="s"),
    "mpi-shm": dict(color="C2", marker="^"),
    "mpi-tcp": dict(color="C2", marker="v", linestyle="--"),
    "mpi": dict(color="C2", marker="^"),
}
ALGO_COLORS = {"hier": "C1", "ring": "C4", "rhd": "C5", "rd": "C6", "tree": "C7", "chain": "C8",
               "bruck": "C9", "direct": "C5"}
OP_TITLES = {"allreduce": "all_reduce", "broadcast": "broadcast", "allgather": "all_gather",
             "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all"}


def pyplot():
    try:
        import matplotlib
    except ImportError:
        sys.exit(f"plot: {sys.executable} cannot import matplotlib: apt-get install python3-matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def style(system):
    if system in STYLE:
        return STYLE[system]
    algo = system.removeprefix("gorun-")
    return dict(color=ALGO_COLORS.get(algo, "C0"), marker=".", linestyle=":", linewidth=1.2)


def busbw(op, world, size, times_us):
    """GB/s of the median time, nccl-tests' way."""
    return expected(op, size, world)[0] / (statistics.median(times_us) * 1e-6) / 1e9 * BUS_FACTOR[op](world)


def curves(rows):
    """{(op, panel): {system: [(size, busbw)]}} from rows of
    (system, op, panel, world, size, [time_us])."""
    out = {}
    for system, op, panel, world, size, times in rows:
        if size <= LATENCY_MAX:
            continue  # a latency, not a bandwidth
        out.setdefault((op, panel), {}).setdefault(system, []).append((size, busbw(op, world, size, times)))
    for lines in out.values():
        for pts in lines.values():
            pts.sort()
    return out


def draw(plt, per_op, panels, panel_title, path, bounds=None):
    """One figure: a panel per entry of panels."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels):
        lines = per_op.get(panel, {})
        order = list(STYLE)
        for system in sorted(lines, key=lambda s: (order.index(s) if s in order else len(order), s)):
            xs, ys = zip(*lines[system])
            ax.plot(xs, ys, label=system, **style(system))
        if bounds and panel in bounds:
            xs, ys = zip(*sorted(bounds[panel]))
            ax.plot(xs, ys, color="black", linestyle="--", linewidth=1, label="link bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({x for pts in lines.values() for x, _ in pts})
        ax.set_xticks(sizes, [label(s) for s in sizes], rotation=30)
        ax.set_xlabel("message size")
        ax.set_title(panel_title(panel))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (GB/s)")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 4 if len(panels) == 1 else 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.80 if len(labels) > 4 else 0.88))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_collectives(raw, out_dir, stem, fmt="png"):
    """compare.py's raw["collectives"] (one host): a figure per collective,
    a panel per world size, the ranks unbound (gorun's default and
    torchrun's) where the run measured them so. Returns the paths written."""
    plt = pyplot()
    binds = {r.get("bind", "bound") for r in raw}
    bind = "unbound" if "unbound" in binds else "bound"
    rows = [(r["system"], r["op"], r["world"], r["world"], r["size"], r["time_us"])
            for r in raw if r.get("bind", "bound") == bind]
    per = curves(rows)
    paths = []
    for op in dict.fromkeys(r[1] for r in rows):
        panels = sorted({p for o, p in per if o == op})
        path = os.path.join(out_dir, f"{stem}-collectives-{op}.{fmt}")
        draw(plt, {p: per[(op, p)] for p in panels}, panels,
             lambda w, op=op: f"{OP_TITLES[op]}, one host, {w} ranks {bind}", path)
        paths.append(path)
    return paths


def plot_links(result, out_dir, stem, fmt="png"):
    """links.py's result: a figure per collective, a panel per host count,
    the link's bound dashed. Returns the paths written."""
    import links
    plt = pyplot()
    per_host = result["per_host"]
    grouped = {}
    for t in result["times"]:
        grouped.setdefault((t["system"], t["op"], t["hosts"], t["size"]), []).append(t["time_us"])
    rows = [(s, op, h, h * per_host, size, times) for (s, op, h, size), times in grouped.items()]
    per = curves(rows)
    paths = []
    for op in dict.fromkeys(r[1] for r in rows):
        panels = sorted({p for o, p in per if o == op})
        sizes = sorted({r[4] for r in rows if r[1] == op})
        bounds = {h: [(s, links.bound_busbw(op, None, h, s, result["rate"])) for s in sizes] for h in panels}
        path = os.path.join(out_dir, f"{stem}-links-{op}.{fmt}")
        draw(plt, {p: per[(op, p)] for p in panels}, panels,
             lambda h, op=op: f"{OP_TITLES[op]}, {h} hosts x {per_host} ranks, {result['rate']} links", path, bounds)
        paths.append(path)
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", help="compare.py --json output, or links.py --json output")
    p.add_argument("--out-dir", default=".")
    p.add_argument("--stem", default="bench", help="file name start (default bench)")
    p.add_argument("--format", default="png", choices=("png", "svg"))
    args = p.parse_args()
    paths = []
    for name in args.json:
        with open(name) as f:
            data = json.load(f)
        if "times" in data and "rate" in data:
            data = {"links": data}
        if data.get("collectives"):
            paths += plot_collectives(data["collectives"], args.out_dir, args.stem, args.format)
        if data.get("links"):
            paths += plot_links(data["links"], args.out_dir, args.stem, args.format)
    print("\n".join(paths))


if __name__ == "__main__":
    main()

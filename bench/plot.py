#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the benchmark tables as the figures of docs/performance.md.

  bench/plot.py [--results bench/results] [--out docs/performance]

Reads plot-{allreduce,grad_sync,overlap}-np{2,4}.txt under --results (what
`tools/dev.sh bench plot` writes) and writes:
  bandwidth.png  bus bandwidth against size, per strategy beside raw MPI, one panel per rank count
  vs_raw.png     each strategy's time over raw MPI's on the same bytes (below 1: faster)
  step.png       ResNet-50: the gradient synchronisation by grouping, and a step's time split into
                 compute and the reduction it leaves exposed (sequential, overlapped, double-buffered)
"""

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a CI machine
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tables  # noqa: E402

# The strategies a user picks, and raw MPI; the /nocheck, /traced and /notimeout variants are
# in the tables and in docs/performance.md, not in the figures.
STRATEGIES = ["raw", "flat", "naive", "tensor", "ring", "hierarchical", "two_dimensional"]
STYLE = {
    "raw": dict(color="black", linestyle="--", marker="o"),
    "flat": dict(color="tab:blue", marker="s"),
    "naive": dict(color="tab:orange", marker="^"),
    "tensor": dict(color="tab:green", marker="D"),
    "ring": dict(color="tab:red", marker="v"),
    "hierarchical": dict(color="tab:purple", marker="P"),
    "two_dimensional": dict(color="tab:brown", marker="X"),
}
LABEL = {
    "raw": "raw MPI_Allreduce (one call)",
    "flat": "flat (allreduce_grad)",
    "naive": "naive (allreduce_grad)",
    "tensor": "allreduce (one tensor)",
    "ring": "cohort's ring",
    "hierarchical": "hierarchical",
    "two_dimensional": "two_dimensional",
}


def size_label(n):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def series(rows, method, field):
    points = sorted((r["bytes"], r[field]) for r in rows if r["method"] == method)
    return [p[0] for p in points], [p[1] for p in points]


def size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ticks = sizes[::2]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(t) for t in ticks], rotation=45, ha="right")
    ax.set_xlabel("bytes reduced (float32 tensors of at most 1 MiB)")
    ax.grid(True, which="major", alpha=0.3)


def per_size_figure(runs, field, ylabel, title, path, reference=None):
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.8), sharey=True)
    for ax, (n, rows) in zip(axes, runs):
        sizes = sorted({r["bytes"] for r in rows})
        for method in STRATEGIES:
            x, y = series(rows, method, field)
            if x:
                ax.plot(x, y, label=LABEL[method], linewidth=1.4, markersize=4, **STYLE[method])
        if reference is not None:
            ax.axhline(reference, color="grey", linewidth=0.8)
        size_axis(ax, sizes)
        ax.set_title(f"{n} ranks")
    axes[0].set_ylabel(ylabel)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bar_axis(ax, ticks, labels, fontsize, xlabel, title):
    """Labels a horizontal bar chart read from the top, with its legend and grid."""
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=fontsize)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)


def step_figure(grad_sync_runs, overlap_runs, path):
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))

    # Left: one synchronisation of ResNet-50's gradients, by grouping.
    methods = [r["method"] for r in grad_sync_runs[0][1]]
    width = 0.8 / len(grad_sync_runs)
    for k, (n, rows) in enumerate(grad_sync_runs):
        times = {r["method"]: r["time_ms"] for r in rows}
        left.barh([i + k * width for i in range(len(methods))],
                  [times.get(m, 0) for m in methods], height=width, label=f"{n} ranks")
    bar_axis(left, [i + width * (len(grad_sync_runs) - 1) / 2 for i in range(len(methods))],
             methods, 8, "time of one synchronisation (ms)",
             "ResNet-50's 161 gradients (102 MB), by grouping")

    # Right: a step = compute + the reduction left exposed (step time - compute alone).
    shown = ["sequential", "overlap", "double buffering"]
    labels, compute, exposed = [], [], []
    for n, rows in overlap_runs:
        by = {(r["compute_ms"], r["method"]): r["time_ms"] for r in rows}
        for c in sorted({r["compute_ms"] for r in rows}):
            alone = by[(c, "compute only")]
            for method in shown:
                labels.append(f"{n}r {c}ms {method}")
                compute.append(alone)
                exposed.append(max(by[(c, method)] - alone, 0.0))
    y = range(len(labels))
    right.barh(y, compute, color="tab:gray", label="compute (backward simulated)")
    right.barh(y, exposed, left=compute, color="tab:red", label="reduction exposed")
    bar_axis(right, list(y), labels, 7, "time of one step (ms)",
             "a step's time: compute and exposed reduction (flat)")

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent.parent / "docs" / "performance")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    def load(kind, reader):
        runs = []
        for n in args.ranks:
            path = args.results / f"plot-{kind}-np{n}.txt"
            if tables.ranks(path) != n:
                sys.exit(f"{path}: a table of {tables.ranks(path)} ranks, not {n}")
            runs.append((n, reader(path)))
        return runs

    allreduce = load("allreduce", tables.allreduce)
    per_size_figure(allreduce, "busbw", "bus bandwidth (GB/s, busbw = algbw · 2(n-1)/n)",
                    "All-reduce bandwidth by strategy (median of 20 runs, 10 from 64 MiB)",
                    args.out / "bandwidth.png")
    per_size_figure(allreduce, "vs_raw", "time ÷ raw MPI_Allreduce's time (below 1: faster)",
                    "Each strategy beside one MPI_Allreduce of the same bytes, same run",
                    args.out / "vs_raw.png", reference=1.0)
    step_figure(load("grad_sync", tables.grad_sync), load("overlap", tables.overlap),
                args.out / "step.png")
    for name in ("bandwidth.png", "vs_raw.png", "step.png"):
        print(args.out / name)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the network term of docs/algorithms.md's cost model against bench/multihost.sh's runs.

  bench/multihost_model.py [--results bench/results] [--link-mbs 119.5] [--from-bytes 1048576]
                           [--plot docs/performance/multihost.png]

Across hosts whose links are the bottleneck, an all-reduce of S bytes takes L·S/B: B is the
link's goodput (TCP at a 1 Gbit/s tbf limit: 119.5 MB/s, measured on this machine's namespaces),
and L how many times S each host's link must carry one way, which the algorithm and the ranks'
placement fix (H hosts, K ranks each, ranks numbered host by host):

  ring over all n = H·K ranks          2(n-1)/n     (one ring edge leaves each host)
  recursive doubling                   (rounds whose partner is on another host) · K
  Rabenseifner (Open MPI: distance 1 first)  2(H-1)/H  (the halving crosses hosts last)
  hierarchical, two_dimensional        2(H-1)/H     (one all-reduce of S, or K of S/K, between hosts)
  flat, naive, tensor                  Open MPI's own choice for their 1 MiB segments: Rabenseifner

The host's own terms (shared memory, the packing) are those of the fit on one host
(bench/cost_model.py): below 1% of these times from 1 MiB up, and left out. Prints the model
beside every row from --from-bytes up, and the median error per strategy.
"""

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

MiB = 1 << 20


def rounds_across(n, per_host):
    # Recursive doubling's partners are at distances 1, 2, 4...: a round crosses hosts where the
    # distance is at least a host's ranks.
    return sum(1 for r in range(int(math.log2(n))) if (1 << r) >= per_host)


def link_share(method, hosts, per_host):
    n = hosts * per_host
    two_level = 2 * (hosts - 1) / hosts
    if method == "raw/ring" or method == "ring":
        return 2 * (n - 1) / n
    if method == "raw/recursive_doubling":
        return rounds_across(n, per_host) * per_host
    if method in ("raw/rabenseifner", "flat", "naive", "tensor", "hierarchical",
                  "two_dimensional"):
        return two_level
    return None  # raw: Open MPI's decision, which depends on the size; not modelled


def read(path):
    shape = re.search(r"multihost-allreduce-(\d+)x(\d+)\.txt$", str(path))
    hosts, per_host = int(shape.group(1)), int(shape.group(2))
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 8 and fields[0].isdigit():
            rows.append((int(fields[0]), fields[3], float(fields[4]) * 1e-6))
    return hosts, per_host, rows


PLOTTED = ["raw", "raw/recursive_doubling", "raw/ring", "raw/rabenseifner", "ring", "flat",
           "hierarchical", "two_dimensional"]


def plot(files, link, path):
    """Bus bandwidth against size, one panel per shape, the link-bound limit drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(files), figsize=(6 * len(files), 4.6), sharey=True)
    for ax, f in zip(axes, files):
        hosts, per_host, rows = read(f)
        n = hosts * per_host
        bus = 2 * (n - 1) / n  # busbw = algbw · 2(n-1)/n, as nccl-tests
        for method in PLOTTED:
            points = sorted((size, size / t * bus / 1e6) for size, m, t in rows if m == method)
            if points:
                style = "--" if method.startswith("raw") else "-"
                ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o",
                        markersize=3, linewidth=1.2, label=method)
        limit = link / (2 * (hosts - 1) / hosts) * bus / 1e6
        ax.axhline(limit, color="grey", linewidth=1.5, label="the links' limit")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes reduced")
        ax.set_title(f"{hosts} hosts x {per_host} rank(s), 1 Gbit/s links")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("bus bandwidth (MB/s)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--link-mbs", type=float, default=119.5)
    parser.add_argument("--from-bytes", type=int, default=MiB)
    parser.add_argument("--plot", help="also draw bus bandwidth against size into this file")
    args = parser.parse_args()
    link = args.link_mbs * 1e6
    files = sorted(Path(args.results).glob("multihost-allreduce-*x*.txt"))
    if not files:
        sys.exit("no bench/results/multihost-allreduce-HxK.txt: run bench/multihost.sh first")
    if args.plot:
        plot(files, link, args.plot)
    errors = {}
    print(f"# link goodput {args.link_mbs} MB/s; rows from {args.from_bytes} bytes")
    print(f"{'shape':>5} {'bytes':>10} {'method':>24} {'L':>5} {'measured ms':>12} "
          f"{'model ms':>9} {'error':>7} {'of the limit':>12}")
    for path in files:
        hosts, per_host, rows = read(path)
        limit_share = 2 * (hosts - 1) / hosts
        for size, method, seconds in rows:
            share = link_share(method, hosts, per_host)
            if size < args.from_bytes or share is None:
                continue
            model = share * size / link
            error = (seconds - model) / model
            errors.setdefault(method, []).append(abs(error))
            # How close to the link-bound limit (2(H-1)/H · S over one link) the row came.
            of_limit = (limit_share * size / link) / seconds
            print(f"{hosts}x{per_host:<3} {size:>10} {method:>24} {share:5.2f} "
                  f"{seconds * 1e3:12.2f} {model * 1e3:9.2f} {error:+7.1%} {of_limit:12.0%}")
    print()
    print(f"{'method':>24} {'median |error|':>15} {'largest':>8} {'rows':>5}")
    for method, e in sorted(errors.items()):
        print(f"{method:>24} {statistics.median(e):15.1%} {max(e):8.1%} {len(e):5d}")


if __name__ == "__main__":
    main()

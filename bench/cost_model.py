#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the cost model of docs/algorithms.md against the benchmarks.

  bench/cost_model.py [--results bench/results] [--ranks 2 4]

1. Fits α (latency of one message), β (time per byte on the wire) and γ (time per byte of a memory
   pass) to the rows of bench/allreduce (plot-allreduce-np*.txt, 1 MiB tensors, and
   plot-allreduce16k-np*.txt, 16 KiB tensors) by least squares on the relative error, one
   fit per rank count, then prints the model's time beside the measured one for every strategy
   and size. β has two values: β_c while the ranks' buffers fit in the last-level cache together
   (n·S ≤ L3) and β_m past it, where the bytes come from memory; one β cannot describe both (the
   measured bandwidth halves there).
2. Predicts the scaling efficiency of the published large runs (ChainerMN, Horovod, Goyal et al.)
   from the same formulas with those machines' links and GPUs, beside the figures they reported.
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tables  # noqa: E402

KiB, MiB, MB, GB = 1 << 10, 1 << 20, 1e6, 1e9

# cohort's defaults (communicator_options and the bucket plan), as the benchmark ran them.
SEGMENT = 1 * MiB  # segment_bytes: no MPI call is larger
THRESHOLD = 64 * KiB  # fusion_threshold_bytes: a tensor this large is reduced in place
BUCKET, FIRST_BUCKET = 4 * MiB, 1 * MiB  # bucket_bytes, first_bucket_bytes
CARRIED = 32 * KiB  # liveness::max_carried_bytes: a checked all-reduce this small rides the agreement
HEADER = 64  # bytes of an agreement message's header
PREFIX = HEADER + 8  # liveness::prefix_bytes: the header and the train's length
PIECE = 4032  # liveness::eager_bytes: the largest piece of a train
EAGER = 4096  # Open MPI's shared-memory eager limit (btl_vader_eager_limit): larger messages
#               take a rendezvous, a handshake before the copy, so a message has two latencies.
#               The agreement's train (liveness::eager_bytes) stays under it: one eager latency a
#               round, its pieces posted at once.


def last_level_cache():
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(text[:-1]) * {"K": KiB, "M": MiB}[text[-1]]
    except (OSError, ValueError, KeyError):
        return 32 * MiB


PARAMETERS = ("alpha_e", "alpha_r", "beta_c", "beta_m", "gamma")


# A row's cost as coefficients of (α_e, α_r, β_c, β_m, γ): time = coefficients · parameters.
# α_e is the latency of an eager message (at most EAGER bytes), α_r of a rendezvous.
def row_terms(method, n, total, tensors, llc):
    per_tensor = total // tensors
    rounds = math.ceil(math.log2(n)) if n > 1 else 0  # the agreement's recursive doubling
    steps = 2 * (n - 1)  # latencies of one all-reduce (ring)
    wire = 2 * (n - 1) / n * total  # bytes on the wire per rank
    in_cache = n * total <= llc
    checked = not method.endswith("/nocheck")
    base = method.split("/")[0]
    alpha_e = alpha_r = beta = gamma = 0.0

    def calls(nbytes):
        return max(1, math.ceil(nbytes / SEGMENT))

    def latencies(count, message_bytes):
        nonlocal alpha_e, alpha_r
        if message_bytes <= EAGER:
            alpha_e += count
        else:
            alpha_r += count

    def packed_buckets():
        sizes, left = [], total
        while left > 0:
            size = min(left, FIRST_BUCKET if not sizes else BUCKET)
            sizes.append(size)
            left -= size
        return sizes

    carried = checked and total <= CARRIED
    if base == "raw":
        latencies(steps, total)
        beta = wire
    elif base in ("tensor", "naive", "flat", "hierarchical", "two_dimensional"):
        # hierarchical and two_dimensional run flat's all-reduce per bucket on one node, where
        # the tables were measured: their two levels are for several nodes.
        packed = base not in ("tensor", "naive") and per_tensor < THRESHOLD
        if carried and (base == "tensor" or (packed and total <= FIRST_BUCKET)):
            # The data travels in the agreement's messages, a train of eager pieces per round,
            # and is reduced on the way. The receiver reads the train's first piece, then waits
            # for the rest (two latencies a round when there is a rest), which arrived before
            # their receives were posted and are copied once more.
            pieces = math.ceil((PREFIX + total) / PIECE)
            alpha_e += rounds * (1 if pieces == 1 else 2)
            beta, gamma = rounds * (PREFIX + total), total + (rounds * total if pieces > 1 else 0)
            checked = False
        elif packed:
            for size in packed_buckets():
                latencies(steps * calls(size), min(size, SEGMENT))
            beta = wire
        elif base == "tensor":
            latencies(steps * calls(total), min(total, SEGMENT))
            beta = wire
        else:
            latencies(steps * tensors * calls(per_tensor), min(per_tensor, SEGMENT))
            beta = wire
        if packed:
            gamma += 2 * total  # pack and unpack
        if checked:
            latencies(rounds, HEADER)
    elif base == "ring":
        # The ring's 2(n-1) steps, in chunks of 1 MiB, reducing as chunks arrive.
        chunks = max(1, math.ceil(total / n / MiB))
        latencies(steps * chunks, min(total / n, MiB))
        beta, gamma = wire, (n - 1) / n * total
    else:
        return None
    return np.array([alpha_e, alpha_r, beta if in_cache else 0.0, 0.0 if in_cache else beta,
                     gamma])


# The rows the fit uses: the unchecked strategies, whose model is the plain formula, and raw MPI
# while one call is no larger than a segment (past it, Open MPI's one large call works through a
# temporary buffer as large as the message, which no term of the model describes).
def fitted(row):
    return row["method"] in ("naive/nocheck", "flat/nocheck", "tensor/nocheck") or (
        row["method"] == "raw" and row["bytes"] <= SEGMENT)


def fit(rows, n, llc):
    design, measured = [], []
    for row in rows:
        if fitted(row):
            design.append(row_terms(row["method"], n, row["bytes"], row["tensors"], llc))
            measured.append(row["time_us"] * 1e-6)
    design, measured = np.array(design), np.array(measured)
    weighted = design / measured[:, None]  # relative error: small and large rows count alike
    active = [i for i in range(design.shape[1]) if design[:, i].any()]
    while True:
        solution, *_ = np.linalg.lstsq(weighted[:, active], np.ones(len(measured)), rcond=None)
        if (solution >= 0).all():
            break
        # A negative cost has no meaning: drop the term and fit the others again.
        del active[int(np.argmin(solution))]
    params = np.zeros(design.shape[1])
    params[active] = solution
    return params


def check_machine(results, ranks, llc):
    print(f"# 1. The model fitted on this machine (last-level cache {llc // MiB} MiB)")
    print("#    time = alpha * latencies + beta * bytes on the wire + gamma * bytes of memory passes;")
    print("#    fitted on naive/nocheck, flat/nocheck, tensor/nocheck and raw up to 1 MiB;")
    print("#    every other row is a prediction. err = predicted / measured - 1")
    summary = []
    for n in ranks:
        rows = []
        for kind in ("allreduce", "allreduce16k"):
            path = results / f"plot-{kind}-np{n}.txt"
            if tables.ranks(path) != n:
                sys.exit(f"{path}: a table of {tables.ranks(path)} ranks, not {n}")
            for row in tables.allreduce(path):
                row["table"] = kind
                rows.append(row)
        params = fit(rows, n, llc)
        shown = []
        for name, value in zip(PARAMETERS, params):
            if name.startswith("alpha"):
                shown.append(f"{name} = {value * 1e6:.2f} us")
            else:
                rate = f"{1 / value / GB:.1f} GB/s" if value else "not identified"
                shown.append(f"{name} = {value * 1e9:.4f} ns/B ({rate})")
        print(f"\n## {n} ranks: " + ", ".join(shown))
        print(f"{'bytes':>11} {'tensors':>7} {'method':>15} {'measured(us)':>12} "
              f"{'model(us)':>10} {'err':>7}  fit")
        per_method = {}
        table = None
        for row in rows:  # in the tables' order: by size, then strategy
            if row["table"] != table:
                table = row["table"]
                print("# float32 tensors of at most " +
                      ("16 KiB" if table.endswith("16k") else "1 MiB") + f" (plot-{table}-np{n}.txt)")
            terms = row_terms(row["method"], n, row["bytes"], row["tensors"], llc)
            if terms is None:
                continue
            predicted = float(terms @ params) * 1e6
            error = predicted / row["time_us"] - 1
            mark = "yes" if fitted(row) else ""
            print(f"{row['bytes']:>11} {row['tensors']:>7} {row['method']:>15} "
                  f"{row['time_us']:>12.2f} {predicted:>10.2f} {error:>+7.0%}  {mark}")
            key = row["method"] if row["method"] != "raw" or row["bytes"] <= SEGMENT else "raw, one call > 1 MiB"
            per_method.setdefault(key, []).append(abs(error))
        for method, errors in per_method.items():
            summary.append((n, method, len(errors), sum(e <= 0.2 for e in errors),
                            float(np.median(errors))))
    print("\n## Summary: rows within 20% of the model, per strategy")
    print(f"{'ranks':>5} {'method':>22} {'rows':>5} {'within 20%':>10} {'median |err|':>12}")
    for n, method, count, within, median in summary:
        print(f"{n:>5} {method:>22} {count:>5} {within:>10} {median:>12.0%}")


# Published runs: (label, GPUs, GPUs per node, gradient bytes, seconds of compute per step,
# intra-node and network bandwidth in bytes/s, network latency, messages per step, overlapped,
# the efficiency reported, the baseline's GPU count, the all-reduce: "ring" through every GPU,
# or "hierarchical" with a "ring" or "halving-doubling" between the nodes). Sources in
# docs/algorithms.md.
CLUSTERS = [
    # ChainerMN (Akiba et al. 2017; chainer.org, 2017-02-08): 32 nodes x 4 GeForce GTX TITAN X
    # (Maxwell), InfiniBand FDR 4X, ResNet-50, 32 images per GPU; NCCL in the node, MPI between;
    # the gradients all-reduced after backward, packed in one buffer. Compute: 32 / 139 images/s
    # (tf_cnn_benchmarks on a GTX Titan X, batch 32).
    ("ChainerMN, ResNet-50", 128, 4, 25.6e6 * 4, 32 / 139, 10 * GB, 56e9 / 8, 2e-6, 1, False,
     "90% (paper); 78% (blog: 100x)", 1, "hierarchical, ring"),
    # Horovod (Sergeev & Del Balso 2018; horovod docs/benchmarks): 128 servers x 4 Pascal GPUs,
    # RoCE 25 Gbit/s; 64 images per GPU; NCCL's ring over every GPU, tensors fused into 64 MB
    # buffers as they become ready in backward. Compute: 64 / (P100 images/s of tf_cnn_benchmarks:
    # Inception V3 142, VGG-16 154; ResNet-101 130, between ResNet-50's 219 and ResNet-152's 91.8
    # by FLOPs).
    ("Horovod, Inception V3", 512, 4, 23.8e6 * 4, 64 / 142, 10 * GB, 25e9 / 8, 5e-6, 2, True,
     "90%", 1, "ring"),
    ("Horovod, ResNet-101", 512, 4, 44.5e6 * 4, 64 / 130, 10 * GB, 25e9 / 8, 5e-6, 3, True,
     "90%", 1, "ring"),
    ("Horovod, VGG-16", 512, 4, 138.4e6 * 4, 64 / 154, 10 * GB, 25e9 / 8, 5e-6, 9, True,
     "68%", 1, "ring"),
    # Goyal et al. 2017: 32 servers x 8 P100 (NVLink), 50 Gbit Ethernet, ResNet-50 (100 MB of
    # gradients), 32 images per GPU, aggregation in parallel with backprop, per layer, recursive
    # halving and doubling between the servers; 8 to 256 GPUs.
    # Compute: 32 / 195 images/s (P100, batch 32).
    ("Goyal et al., ResNet-50", 256, 8, 25.6e6 * 4, 32 / 195, 20 * GB, 50e9 / 8, 10e-6, 161,
     True, "~90% (8 to 256 GPUs)", 8, "hierarchical, halving-doubling"),
]


def reduction_time(gpus, per_node, size, intra, network, latency, messages, algorithm):
    nodes = gpus // per_node
    if algorithm == "ring":
        # One ring through every GPU: each node's link carries 2(N-1)/N of the bytes each way.
        return 2 * (gpus - 1) / gpus * size / (network if nodes > 1 else intra) + \
            messages * 2 * (gpus - 1) * latency
    # hierarchical: a reduce and a broadcast in the node, an all-reduce among the nodes
    # (bandwidth-optimal either way; the ring has 2(m-1) steps, halving-doubling 2 log2 m).
    inside = 2 * size / intra if per_node > 1 else 0.0
    if nodes == 1:
        return inside
    steps = 2 * (nodes - 1) if algorithm.endswith("ring") else 2 * math.ceil(math.log2(nodes))
    return inside + 2 * (nodes - 1) / nodes * size / network + messages * steps * latency


def check_clusters():
    print("\n# 2. The model at scale: published runs (weak scaling, the same batch per GPU)")
    print("#    efficiency = baseline step / step; step = compute + the reduction left exposed;")
    print("#    exposed: all of it without overlap, max(0, reduce - backward) + the last bucket with")
    print("#    overlap (backward = 2/3 of compute). Links and GPUs: the published machines'.")
    print(f"{'run':>24} {'GPUs':>5} {'compute':>8} {'reduce':>8} {'no overlap':>10} "
          f"{'overlap':>8} {'the run did':>11} {'published':>30}")
    for (label, gpus, per_node, size, compute, intra, network, latency, messages, overlapped,
         published, baseline_gpus, algorithm) in CLUSTERS:
        def step(count, overlap):
            reduce = reduction_time(count, min(per_node, count), size, intra, network, latency,
                                    messages, algorithm) if count > 1 else 0.0
            if not overlap:
                return compute + reduce, reduce
            backward = 2 / 3 * compute
            last = reduce / max(messages, 1)
            return compute + max(0.0, reduce - backward) + last, reduce

        rows = []
        for overlap in (False, True):
            full, reduce = step(gpus, overlap)
            base, _ = step(baseline_gpus, overlap)
            rows.append((base / full, reduce))
        chosen = "overlap" if overlapped else "no overlap"
        print(f"{label:>24} {gpus:>5} {compute * 1e3:>6.0f}ms {rows[0][1] * 1e3:>6.0f}ms "
              f"{rows[0][0]:>10.0%} {rows[1][0]:>8.0%} {chosen:>11} {published:>30}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    check_machine(args.results, args.ranks, last_level_cache())
    check_clusters()


if __name__ == "__main__":
    main()

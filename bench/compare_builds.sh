#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two builds of the benchmarks side by side: bench_grad_sync, bench_overlap and bench_allreduce
# of BEFORE and AFTER (directories holding the three binaries) run in turn, before then after,
# --runs times, so that a machine that drifts slows both alike. Prints, for every row, the median
# over the runs of each binary's own figure and after/before; bench_allreduce's rows also give
# each strategy's time over raw MPI_Allreduce in the same run, which the drift affects least.
#
#   bench/compare_builds.sh BEFORE_DIR AFTER_DIR [--runs N] [--np N]
set -euo pipefail

[ $# -ge 2 ] || { sed -n '3,9p' "${BASH_SOURCE[0]}"; exit 2; }
before=$1
after=$2
shift 2
runs=3
np=2
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --np) np=$2; shift 2 ;;
    *) sed -n '3,9p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun -np "$np" --oversubscribe --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)

declare -A args=(
  [grad_sync]="--iters 20"
  [overlap]="--iters 5"
  [allreduce]="--min-bytes 4K --max-bytes 4M --iters 30"
)
for ((i = 0; i < runs; ++i)); do
  for bench in grad_sync overlap allreduce; do
    for side in before after; do
      dir=$before
      [ "$side" = after ] && dir=$after
      # shellcheck disable=SC2086
      "${mpi[@]}" "$dir/bench_$bench" ${args[$bench]} >"$work/$bench.$side.$i"
    done
  done
done

python3 - "$work" "$runs" "$np" <<'PY'
import statistics, sys
work, runs, np = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def rows(bench, side, i):
    out = {}
    for line in open(f"{work}/{bench}.{side}.{i}"):
        if line.startswith("#") or not line.strip():
            continue
        f = line.split()
        if bench == "grad_sync":    # method, grouping..., collectives, time, vs raw, vs tensor
            out[" ".join(f[:-4])[:60]] = (float(f[-3]), None)
        elif bench == "overlap":    # compute, method..., time, vs ideal, vs sum
            out[" ".join(f[:-3])] = (float(f[-3]), None)
        else:                       # bytes, elements, tensors, method, time, ..., vs raw
            out[f"{f[0]:>10} {f[3]:>16}"] = (float(f[4]), float(f[-1]))
    return out

for bench in ("grad_sync", "overlap", "allreduce"):
    print(f"## bench_{bench}, {np} ranks: median of {runs} runs of each binary, run in turn")
    data = {side: [rows(bench, side, i) for i in range(runs)] for side in ("before", "after")}
    keys = list(data["before"][0])
    ratio_cols = bench == "allreduce"
    head = f"{'row':<62} {'before':>10} {'after':>10} {'after/before':>13}"
    if ratio_cols:
        head += f" {'before/raw':>11} {'after/raw':>10}"
    print(head)
    for k in keys:
        med = {}
        rel = {}
        for side in ("before", "after"):
            vals = [r[k] for r in data[side] if k in r]
            med[side] = statistics.median(v[0] for v in vals)
            if ratio_cols:
                rel[side] = statistics.median(v[1] for v in vals)
        line = f"{k:<62} {med['before']:>10.2f} {med['after']:>10.2f} {med['after'] / med['before']:>13.3f}"
        if ratio_cols:
            line += f" {rel['before']:>11.2f} {rel['after']:>10.2f}"
        print(line)
    print()
PY

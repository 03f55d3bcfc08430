#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a lost host costs under tools/cohort-run (issue 37): test/multihost/multihost.sh's
# lost-host job (3 simulated hosts x 1 rank, links at 1 Gbit/s, examples/mnist_mlp for 1000 steps
# saving every 10; host3's processes killed and its link cut right after the checkpoint of step
# 270) run ROUNDS times; the median of each interval, beside the same job without a fault, run in
# the same round. Needs root. Writes bench/results/launcher.txt.
#
#   bench/launcher.sh [--build DIR] [--rounds N] [--probe-timeout S]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
rounds=5
probe_timeout=10
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --probe-timeout) probe_timeout=$2; shift 2 ;;
    *) sed -n '3,9p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done
[ -x "$build/examples/mnist_mlp" ] || { echo "launcher.sh: no $build/examples/mnist_mlp" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
for round in $(seq 1 "$rounds"); do
  echo "round $round of $rounds" >&2
  MULTIHOST_HOSTS=3 PROBE_TIMEOUT=$probe_timeout bash "$root/test/multihost/multihost.sh" \
    launcher lost-host "$build/examples/mnist_mlp" --epochs 20 --train-size 3000 \
    --test-size 1000 --global-batch 60 --hidden 128 | grep '^launcher-times' >>"$raw"
done
{
  echo "# cohort-run: what a lost host costs (bench/launcher.sh, $(date -u +%Y-%m-%d))"
  echo "# 3 simulated hosts x 1 rank (tools/cluster.sh, 1 Gbit/s links, 2 cores shared), mnist_mlp"
  echo "# (no BLAS: its own loops), 1000 steps of 60 examples, a checkpoint every 10 steps;"
  echo "# host3 killed and its link cut right after the checkpoint of step 270; --probe-timeout"
  echo "# $probe_timeout. Median of $rounds rounds, each with its own run without a fault."
  echo "#"
  echo "# detected: the fault to the attempt's end (Open MPI notices the lost daemon)"
  echo "# probed:   the end to the next attempt (cohort-run probes every host; host3's probe fails)"
  echo "# resumed:  the next attempt's start to the trainer's 'resumed from step' (mpirun, MPI,"
  echo "#           the checkpoint read)"
  echo "# run / without a fault: the whole job's wall time (after the fault it runs on 2 ranks,"
  echo "#           whose steps are faster on 2 cores than 3 ranks': the difference is not the loss)"
  echo "# grow (the grow row): host3 back once the job resumed on 2; --grow-check 1 ends the job"
  echo "#           right after its next checkpoint: 'restarted' from that end to the attempt on 3,"
  echo "#           'resumed' from there to the trainer's 'resumed from step'"
  printf '%-7s %9s %8s %8s %10s %10s %10s %8s %9s  %s\n' case detected probed resumed "lost (sum)" \
    "grow: rest." "grow: res." run "no fault" "test accuracy (no fault)"
  for way in shrink grow; do
    awk -F'\t' -v way="$way" '
      function median(a, n,   i, j, t) {
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
      }
      $2 == way {
        n++; d[n] = $3; p[n] = $4; r[n] = $5; s[n] = $3 + $4 + $5; t[n] = $6; w[n] = $7
        g[n] = $10; h[n] = $11; acc = acc sep $8 " (" $9 ")"; sep = ", "
      }
      END {
        if (!n) exit
        gr = g[1] == "-" ? "-" : sprintf("%.1fs", median(g, n))
        gs = h[1] == "-" ? "-" : sprintf("%.1fs", median(h, n))
        printf "%-7s %8.1fs %7.1fs %7.1fs %9.1fs %10s %10s %7.1fs %8.1fs  %s\n", way, median(d, n), median(p, n), median(r, n), median(s, n), gr, gs, median(t, n), median(w, n), acc
      }
    ' "$raw"
  done
} | tee "$root/bench/results/launcher.txt"

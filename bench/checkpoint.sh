#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cohort's checkpoint save and resume for 100 MB and 1 GB of state at 1 and 2 ranks, beside a
# plain sequential write + fsync of the same bytes (dd conv=fsync) and a plain read, in the same
# run (bench/checkpoint.cpp: medians of --reps); then speed ratios (plain time ÷ cohort's time;
# goal ≥ 0.8) and what save stalls the trainer for with `async`, beside a memcpy of the state.
#
#   bench/checkpoint.sh [--build DIR] [--reps N] [--quick]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
reps=12
sizes=(100M 1G)
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --quick) sizes=(8M); reps=2; shift ;;
    *) sed -n '3,8p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done
bin=$build/bench/bench_checkpoint
[ -x "$bin" ] || { echo "checkpoint: $bin not built"; exit 2; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --bind-to none)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)

printf '%-16s %9s %9s %6s %9s %9s %6s %6s %11s %9s %10s\n' "state, ranks" "save ms" "dd ms" "ratio" \
  "resume ms" "read ms" "ratio" "vs dd" "async stall" "memcpy ms" "completion"
for size in "${sizes[@]}"; do
  for ranks in 1 2; do
    line=$("${mpirun[@]}" -np "$ranks" "$bin" --bytes "$size" --reps "$reps")
    # "checkpoint MB MB RANKS rank(s): save X dd X resume X read X async-stall X memcpy X
    #  async-completion X"
    read -r _ mb _ _ _ _ save _ dd _ resume _ read _ stall _ copy _ completion <<<"$line"
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
    printf '%-16s %9.1f %9.1f %6s %9.1f %9.1f %6s %6s %11.1f %9.1f %10.1f\n' "$mb MB, $ranks" \
      "$save" "$dd" "$(ratio "$dd" "$save")" "$resume" "$read" "$(ratio "$read" "$resume")" \
      "$(ratio "$dd" "$resume")" "$stall" "$copy" "$completion"
  done
done
echo "(ratio: the plain operation's time ÷ cohort's; vs dd: dd's time ÷ the resume's, the issue's" \
  "baseline for both; medians of $reps)"

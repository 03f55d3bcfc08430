#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 35's accuracy table: the examples mnist_mlp and torch_mnist trained with the mean and
# with PowerSGD at ranks 1, 2 and 4 (compressed from the first step, and after 10% of the steps
# uncompressed), at 2 and 4 ranks, over several seeds; the test accuracy of each, as the mean over
# the seeds and its spread (min-max), and the difference to the mean reducer's at the same ranks.
# With --data DIR, real MNIST (the four IDX files); without, the examples' synthetic set.
#
#   bench/powersgd_accuracy.sh [--build DIR] [--data DIR] [--seeds "1 2 3"] [--ranks "2 4"]
#                              [--only mnist_mlp|torch_mnist]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
data=
seeds="1 2 3"
ranks_list="2 4"
only=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) sed -n '3,10p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 \
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_btl_vader_single_copy_mechanism=none
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo unknown)

# The test accuracy (in %) of one run.
accuracy() { # EXAMPLE RANKS SEED REDUCER EPOCHS
  local program=$build/examples/$1 args=(--seed "$3" --reducer "$4" --epochs "$5")
  [ -n "$data" ] && args+=(--data "$data")
  mpirun -np "$2" "$program" "${args[@]}" | awk '/^test accuracy:/ {printf "%.2f", 100 * $3}'
}

# The mean over the seeds and its spread, of the test accuracy after EPOCHS epochs.
summary() { # EXAMPLE RANKS REDUCER EPOCHS
  local seed values=()
  for seed in $seeds; do
    values+=("$(accuracy "$1" "$2" "$seed" "$3" "$4")")
  done
  printf '%s\n' "${values[@]}" | awk '{s += $1; if (NR == 1 || $1 < lo) lo = $1;
    if (NR == 1 || $1 > hi) hi = $1} END {printf "%.2f %.2f %.2f", s / NR, lo, hi}'
}

# Steps of a 3-epoch run: 3 x (train examples / global batch 64): 6000 synthetic, 60000 MNIST.
examples=${only:-mnist_mlp torch_mnist}
train=$([ -n "$data" ] && echo 60000 || echo 6000)
start=$((3 * train / 64 / 10))
reducers="mean powersgd:1 powersgd:2 powersgd:4 powersgd:1:$start powersgd:2:$start powersgd:4:$start"
echo "# bench/powersgd_accuracy.sh: test accuracy (%) after 1 epoch (still climbing) and after the"
echo "# examples' 3 epochs, global batch 64; $([ -n "$data" ] && echo "MNIST from $data" || echo "the examples' synthetic MNIST-shaped set (6000 train, 1000 test; 5% of its labels wrong: ~95% at best)");"
echo "# seeds: $seeds (the data, the weights, the shuffling): the mean over them [min, max], and its"
echo "# difference to the mean reducer's at the same ranks; powersgd:R[:START]: rank R, compressed"
echo "# after START uncompressed steps (10% of a 3-epoch run's); BLAS: $blas"
printf '%-12s %5s %-16s | %7s %15s %8s | %7s %15s %8s\n' example ranks reducer "1 epoch" "[min, max]" \
  "vs mean" "3 epochs" "[min, max]" "vs mean"
for example in $examples; do
  for ranks in $ranks_list; do
    base1= base3=
    for reducer in $reducers; do
      read -r a1 lo1 hi1 <<<"$(summary "$example" "$ranks" "$reducer" 1)"
      read -r a3 lo3 hi3 <<<"$(summary "$example" "$ranks" "$reducer" 3)"
      [ "$reducer" = mean ] && base1=$a1 base3=$a3
      printf '%-12s %5s %-16s | %7s %15s %+8.2f | %7s %15s %+8.2f\n' "$example" "$ranks" "$reducer" \
        "$a1" "[$lo1, $hi1]" "$(awk -v a="$a1" -v b="$base1" 'BEGIN {print a - b}')" \
        "$a3" "[$lo3, $hi3]" "$(awk -v a="$a3" -v b="$base3" 'BEGIN {print a - b}')"
    done
  done
done

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 36's memory and speed tables: an MLP of 6 Linear(4096, 4096) layers (100.7 M parameters,
# 384 MiB in fp32; --layers 12 --width 2896: the same size in 12 tensors) trained with Adam,
# batch 8 per rank, one intra-op thread per rank, overlapped, on 1-4 ranks of this machine. Rows: cohort::torch::distributed_optimizer (unsharded),
# cohort::torch::sharded_optimizer at stage 1 and stage 2; PyTorch (python3-torch, gloo) DDP with
# Adam (unsharded) and with ZeroRedundancyOptimizer (stage 1). Each row prints the largest rank's
# optimizer state, gradients (held between steps), parameters, resident set and its peak, in MiB,
# and the median step time of 3 repetitions of 3 steps after a warm-up step; the rows take turns
# for --rounds rounds and the table shows each row's median step time over the rounds (the
# memory is the same every round). Then the state and the gradients as a fraction of the
# unsharded optimizer's (the goal: 1/N + 5%), and each stage's step time over the unsharded one.
#
#   bench/sharding.sh [--build DIR] [--rounds N] [--ranks "1 2 3 4"] [--layers L --width W]
#                     [--quick]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
rounds=1
ranks_list="1 2 3 4"
amounts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ranks) ranks_list=$2; shift 2 ;;
    --layers|--width) amounts+=("$1" "$2"); shift 2 ;;
    --quick) amounts+=(--layers 2 --width 256 --steps 2 --reps 2); ranks_list="1 2"; shift ;;
    *) sed -n '3,16p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done

bin=$build/bench/bench_sharding
[ -x "$bin" ] || { echo "sharding: $bin not built (cmake --build $build --target bench_sharding)"; exit 2; }
python=${COHORT_BENCH_PYTHON:-/usr/bin/python3}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --bind-to none)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo unknown)

modes=(unsharded stage1 stage2 ddp zero)
declare -A times memory
for ((r = 1; r <= rounds; r++)); do
  for n in $ranks_list; do
    for mode in "${modes[@]}"; do
      if [ "$mode" = ddp ] || [ "$mode" = zero ]; then
        line=$("$python" "$root/bench/sharding_zero.py" --mode "$mode" --ranks "$n" "${amounts[@]}")
      else
        line=$("${mpirun[@]}" -np "$n" "$bin" --mode "$mode" "${amounts[@]}")
      fi
      read -r _ _ _ ms rest <<<"$line"
      times[$mode $n]+=" $ms"
      memory[$mode $n]=$rest
    done
  done
done

median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
label() {
  case "$1" in
    unsharded) echo "cohort distributed_optimizer" ;;
    stage1) echo "cohort sharded, stage 1" ;;
    stage2) echo "cohort sharded, stage 2" ;;
    ddp) echo "PyTorch DDP + Adam" ;;
    zero) echo "PyTorch ZeroRedundancyOptimizer" ;;
  esac
}
echo "BLAS: $blas; the largest rank's MiB; ms per step: median of $rounds round(s)"
printf '%-34s %5s %10s %10s %10s %10s %10s %12s\n' row ranks state grads params rss peak_rss ms/step
declare -A ms
for n in $ranks_list; do
  for mode in "${modes[@]}"; do
    ms[$mode $n]=$(median "${times[$mode $n]}")
    read -r state grads params rss hwm <<<"${memory[$mode $n]}"
    printf '%-34s %5s %10s %10s %10s %10s %10s %12s\n' "$(label "$mode")" "$n" "$state" "$grads" \
      "$params" "$rss" "$hwm" "${ms[$mode $n]}"
  done
done
echo
echo "state and gradients over the unsharded optimizer's (goal: state <= 1/N + 5%, and gradients at stage 2):"
printf '%5s %8s %14s %14s %14s %16s\n' ranks "1/N" "stage1 state" "stage2 state" "stage2 grads" "ZeRO(PyTorch) state"
for n in $ranks_list; do
  read -r s0 g0 _ <<<"${memory[unsharded $n]}"
  read -r s1 _ <<<"${memory[stage1 $n]}"
  read -r s2 g2 _ <<<"${memory[stage2 $n]}"
  read -r sd _ <<<"${memory[ddp $n]}"
  read -r sz _ <<<"${memory[zero $n]}"
  awk -v n="$n" -v s0="$s0" -v g0="$g0" -v s1="$s1" -v s2="$s2" -v g2="$g2" -v sd="$sd" -v sz="$sz" \
    'BEGIN {printf "%5d %8.3f %14.3f %14.3f %14.3f %16.3f\n", n, 1/n, s1/s0, s2/s0, g2/g0, sz/sd}'
done
echo
echo "step time over the unsharded optimizer's (goal: within 10%):"
printf '%5s %10s %10s %16s\n' ranks stage1 stage2 "ZeRO/DDP (PyTorch)"
for n in $ranks_list; do
  awk -v n="$n" -v u="${ms[unsharded $n]}" -v a="${ms[stage1 $n]}" -v b="${ms[stage2 $n]}" \
    -v d="${ms[ddp $n]}" -v z="${ms[zero $n]}" \
    'BEGIN {printf "%5d %10.3f %10.3f %16.3f\n", n, a/u, b/u, z/d}'
done

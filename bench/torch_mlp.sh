#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cohort against PyTorch DDP on the same LibTorch work (issue 12): an MLP 784-1024-1024-10, SGD
# with momentum, batch 128 per rank, one intra-op thread per rank. Rows: LibTorch alone in one
# process, and in 2 processes at once (what they cost each other on this machine, without
# cohort); cohort on 1 and 2 ranks, blocking, overlapped and with `dummy` (cohort's work without
# communication; on 2 ranks also unchecked: without the agreement's one rendezvous a step); DDP
# (python3-torch, gloo) on 1 and 2 ranks. Each run times 5 repetitions of 20
# steps after 10 warm-up steps and reports the median repetition; the rows take turns for
# --rounds rounds (default 3) so that a busy machine slows them alike, and the table shows the
# median over the rounds. Then the weak-scaling efficiency (one plain process ÷ 2 ranks) and
# cohort's step time ÷ DDP's.
#
#   bench/torch_mlp.sh [--build DIR] [--rounds N] [--quick]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
rounds=3
amounts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --quick) amounts=(--steps 2 --reps 2 --warmup 1 --batch 16); rounds=1; shift ;;
    *) sed -n '3,13p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done

bin=$build/bench/bench_torch_mlp
[ -x "$bin" ] || { echo "torch_mlp: $bin not built (cmake --build $build --target bench_torch_mlp)"; exit 2; }
# Debian's python3-torch is the reference: the interpreter it is installed for.
python=${COHORT_BENCH_PYTHON:-/usr/bin/python3}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --bind-to none)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)

declare -A samples
rows=("plain 1" "plain 2" "blocking 1" "overlap 1" "dummy 1" "ddp 1" "blocking 2" "overlap 2" "dummy 2" "dummy-unchecked 2" "ddp 2")
for ((r = 1; r <= rounds; r++)); do
  for row in "${rows[@]}"; do
    read -r mode ranks <<<"$row"
    if [ "$mode" = ddp ]; then
      line=$("$python" "$root/bench/torch_mlp_ddp.py" --ranks "$ranks" "${amounts[@]}")
    elif [ "$row" = "plain 1" ]; then
      line=$("$bin" --mode plain "${amounts[@]}")
    else
      line=$("${mpirun[@]}" -np "$ranks" "$bin" --mode "$mode" "${amounts[@]}")
    fi
    samples[$row]+=" $(awk '{print $NF}' <<<"$line")"
  done
done

median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
declare -A ms
printf '%-34s %12s\n' "row (median of $rounds rounds)" "ms per step"
for row in "${rows[@]}"; do
  ms[$row]=$(median "${samples[$row]}")
  read -r mode ranks <<<"$row"
  case "$mode" in
    plain) label="LibTorch alone, $ranks process(es)" ;;
    ddp) label="PyTorch DDP (gloo), $ranks rank(s)" ;;
    *) label="cohort $mode, $ranks rank(s)" ;;
  esac
  printf '%-34s %12.2f\n' "$label" "${ms[$row]}"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo
echo "weak-scaling efficiency on 2 ranks (plain ÷ 2 ranks):"
for mode in plain blocking overlap dummy dummy-unchecked ddp; do
  printf '  %-16s %s\n' "$mode" "$(ratio "${ms[plain 1]}" "${ms[$mode 2]}")"
done
echo "  (plain: two processes without cohort; what is left above it is the machine's, not cohort's)"
echo "cohort ÷ DDP step time on 2 ranks:"
for mode in blocking overlap; do
  printf '  %-10s %s\n' "$mode" "$(ratio "${ms[$mode 2]}" "${ms[ddp 2]}")"
done

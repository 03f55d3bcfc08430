#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a GAN's loop costs with no no_sync() guard, cohort against PyTorch DDP (issue 31): the
# discriminator's first backward and its hooks in the generator's backward each start a
# reduction the guards would save. Rows: cohort and DDP (python3-torch, gloo), each unguarded and
# guarded, on 2 ranks; the models and timing are bench/torch_gan.cpp's. The rows take turns for
# --rounds rounds (default 3); the table shows the median over the rounds, then what the guards
# save per iteration in each (unguarded - guarded) and cohort's ÷ DDP's iteration time.
#
#   bench/torch_gan.sh [--build DIR] [--rounds N] [--ranks N]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
rounds=3
ranks=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    *) sed -n '3,10p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done

bin=$build/bench/bench_torch_gan
[ -x "$bin" ] || { echo "torch_gan: $bin not built (cmake --build $build --target bench_torch_gan)"; exit 2; }
python=${COHORT_BENCH_PYTHON:-/usr/bin/python3}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
mpirun=(mpirun --bind-to none)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)

declare -A samples
rows=("cohort unguarded" "cohort guarded" "ddp unguarded" "ddp guarded")
for ((r = 1; r <= rounds; r++)); do
  for row in "${rows[@]}"; do
    read -r who mode <<<"$row"
    if [ "$who" = ddp ]; then
      line=$("$python" "$root/bench/torch_gan_ddp.py" --ranks "$ranks" --mode "$mode")
    else
      line=$("${mpirun[@]}" -np "$ranks" "$bin" --mode "$mode")
    fi
    samples[$row]+=" $(awk '{print $NF}' <<<"$line")"
  done
done

median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
declare -A ms
# (libblas.so.3 is an alternative: the file it resolves to says which BLAS)
blas=$(ldd "$bin" | awk '/lib(open)?blas/ {print $3; exit}')
blas=$(readlink -f "$blas" 2>/dev/null || echo "$blas")
echo "GAN loop (MLPs: G 64-1024-1024-784, D 784-1024-1024-1; Adam; batch 64 per rank), $ranks ranks, BLAS: ${blas:-unknown}"
printf '%-40s %16s\n' "row (median of $rounds rounds)" "ms per iteration"
for row in "${rows[@]}"; do
  ms[$row]=$(median "${samples[$row]}")
  printf '%-40s %16.2f\n' "$row" "${ms[$row]}"
done
diff() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a - b}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
echo
echo "what the guards save per iteration (unguarded - guarded, ms):"
echo "  cohort $(diff "${ms[cohort unguarded]}" "${ms[cohort guarded]}")   DDP $(diff "${ms[ddp unguarded]}" "${ms[ddp guarded]}")"
echo "cohort ÷ DDP iteration time:"
echo "  unguarded $(ratio "${ms[cohort unguarded]}" "${ms[ddp unguarded]}")   guarded $(ratio "${ms[cohort guarded]}" "${ms[ddp guarded]}")"

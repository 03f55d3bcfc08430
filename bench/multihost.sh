#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cohort across hosts (issue 33): tools/cluster.sh's simulated hosts with links shaped to
# 1 Gbit/s (the rate this machine honours: above about 3 Gbit/s its 2 cores, not the link, set
# the pace). Needs root. Writes its tables to bench/results/multihost-*.txt:
#
#   allreduce-HxK   bench/allreduce at H hosts x K ranks (2x1, 2x2, 4x1), 64 KiB to 16 MiB:
#                   every host strategy beside Open MPI's own MPI_Allreduce ("raw": its default
#                   decision), then the raw row again under each of coll_tuned's forced
#                   algorithms (recursive doubling, ring, Rabenseifner) in runs of their own
#   grad_sync-2x2   bench/grad_sync: ResNet-50's gradients (25.6 M parameters, 161 tensors)
#   torch_mlp-HxK   bench/torch_mlp (2x1, 2x2) (cohort blocking, overlapped) beside PyTorch DDP (gloo) on
#                   the same hosts: the step time, rounds taking turns
#
#   bench/multihost.sh [--build DIR] [--iters N] [--rounds N] [--only allreduce|grad_sync|torch_mlp]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
iters=5
rounds=3
only=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) sed -n '3,16p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done
cluster=$root/tools/cluster.sh
results=$root/bench/results
rate=1gbit
export COHORT_CLUSTER_NAME=cohort-bench COHORT_CLUSTER_SUBNET=10.232.0
trap '"$cluster" down >/dev/null 2>&1' EXIT
python=${COHORT_BENCH_PYTHON:-/usr/bin/python3}
blas=$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu 2>/dev/null || echo unknown)

with_hosts() { # H: a fresh cluster of H hosts
  "$cluster" down >/dev/null 2>&1 || true
  "$cluster" up "$1" --rate "$rate" >/dev/null
}

if [ -z "$only" ] || [ "$only" = allreduce ]; then
  for shape in 2x1 2x2 4x1; do
    hosts=${shape%x*} per_host=${shape#*x}
    with_hosts "$hosts"
    out=$results/multihost-allreduce-$shape.txt
    args=(--min-bytes 64K --max-bytes 16M --iters "$iters" --checked-only)
    {
      echo "# bench/multihost.sh: $hosts hosts x $per_host ranks (tools/cluster.sh), links $rate each way (tc tbf),"
      echo "# on a 2-core machine: every host shares its cores; TCP between hosts, shared memory within one"
      "$cluster" run "$per_host" "$build/bench/bench_allreduce" "${args[@]}"
      # Open MPI's forced algorithms (coll_tuned), the raw row alone (they would change every
      # MPI_Allreduce in the run).
      for algorithm in 3:recursive_doubling 4:ring 6:rabenseifner; do
        echo "# raw under coll_tuned_allreduce_algorithm ${algorithm%%:*} (${algorithm#*:})"
        "$cluster" run "$per_host" --mca coll_tuned_use_dynamic_rules 1 \
          --mca coll_tuned_allreduce_algorithm "${algorithm%%:*}" \
          "$build/bench/bench_allreduce" "${args[@]}" --only raw |
          sed -n "s/ raw / raw\/${algorithm#*:} /p"
      done
    } | tee "$out"
  done
fi

if [ -z "$only" ] || [ "$only" = grad_sync ]; then
  with_hosts 2
  out=$results/multihost-grad_sync-2x2.txt
  {
    echo "# bench/multihost.sh: 2 hosts x 2 ranks, links $rate; ResNet-50's gradients"
    "$cluster" run 2 "$build/bench/bench_grad_sync" --iters "$iters"
  } | tee "$out"
fi

if [ -z "$only" ] || [ "$only" = torch_mlp ]; then
  median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
  difference() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a - b}'; }
  quotient() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
  for shape in ${TORCH_SHAPES:-2x1 2x2}; do
    hosts=${shape%x*} per_host=${shape#*x}
    ranks=$((hosts * per_host))
    with_hosts "$hosts"
    out=$results/multihost-torch_mlp-$shape.txt
    declare -A samples=()
    rows=(dummy blocking overlap ddp)
    for ((r = 1; r <= rounds; r++)); do
      for row in "${rows[@]}"; do
        if [ "$row" = ddp ]; then
          # DDP's ranks from mpirun's environment, its rendezvous on host1, gloo on the hosts'
          # link.
          line=$("$cluster" run "$per_host" -x MASTER_ADDR=10.232.0.1 -x GLOO_SOCKET_IFNAME=eth0 \
            "$python" "$root/bench/torch_mlp_ddp.py" --from-mpi | grep '^ddp')
        else
          line=$("$cluster" run "$per_host" "$build/bench/bench_torch_mlp" --mode "$row")
        fi
        samples[$row]+=" $(awk '{print $NF}' <<<"$line")"
      done
    done
    {
      echo "# bench/multihost.sh: $hosts hosts x $per_host ranks, links $rate; the MLP 784-1024-1024-10 of"
      echo "# bench/torch_mlp (7.4 MB of gradients), batch 128 per rank, one intra-op thread per rank;"
      echo "# BLAS: $blas; 2 cores for all the hosts"
      echo "# each row: the median over $rounds rounds (rows taking turns) of each run's median repetition"
      printf '%-40s %12s\n' "row" "ms per step"
      for row in "${rows[@]}"; do
        case "$row" in
          ddp) label="PyTorch DDP (gloo), $ranks ranks" ;;
          dummy) label="cohort dummy (no transfer), $ranks ranks" ;;
          *) label="cohort $row, $ranks ranks" ;;
        esac
        printf '%-40s %12.2f\n' "$label" "$(median "${samples[$row]}")"
      done
      blocking=$(median "${samples[blocking]}")
      echo "communication in a blocking step (blocking - dummy): $(difference "$blocking" "$(median "${samples[dummy]}")") ms"
      echo "hidden by overlap (blocking - overlap): $(difference "$blocking" "$(median "${samples[overlap]}")") ms"
      for row in blocking overlap; do
        echo "cohort $row / DDP: $(quotient "$(median "${samples[$row]}")" "$(median "${samples[ddp]}")")"
      done
    } | tee "$out"
  done
fi

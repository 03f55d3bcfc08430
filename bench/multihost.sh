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
#   powersgd-HxK    issue 35 (2x2, 4x1): ResNet-50's gradients, bench/powersgd (mean, float16,
#                   PowerSGD) and bench/powersgd_ddp.py (DDP, its fp16 and PowerSGD hooks) one after
#                   the other on the same hosts, and the bytes the links carried per step (tc's
#                   side: what every host sent, headers included); then bench/torch_mlp with
#                   PowerSGD rank 4 beside DDP with powerSGD_hook rank 4, rounds taking turns
#   sharding-HxK    issue 36 (2x1, 2x2): bench/sharding's MLP at 4 x Linear(1024, 1024) (4.2 M
#                   parameters, 16 MiB) with Adam: cohort's distributed_optimizer beside its
#                   sharded_optimizer at stages 1 and 2, the step time, rounds taking turns
#   owners-HxK      with it, bench/reduce_to_owners: stage 2's collectives alone (4 tensors of
#                   4 MiB reduced to their owners one at a time, two or all in flight; copied
#                   back over every rank or by broadcast_each) beside all-reducing them
#
#   bench/multihost.sh [--build DIR] [--iters N] [--rounds N]
#                      [--only allreduce|grad_sync|torch_mlp|powersgd|sharding]
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
    *) sed -n '3,25p' "${BASH_SOURCE[0]}"; exit 2 ;;
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

if [ "$only" = sharding ]; then
  median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
  for shape in 2x1 2x2; do
    hosts=${shape%x*} per_host=${shape#*x}
    ranks=$((hosts * per_host))
    with_hosts "$hosts"
    out=$results/multihost-sharding-$shape.txt
    declare -A samples=()
    rows=(unsharded stage1 stage2)
    for ((r = 1; r <= rounds; r++)); do
      for row in "${rows[@]}"; do
        line=$("$cluster" run "$per_host" "$build/bench/bench_sharding" --mode "$row" \
          --layers 4 --width 1024 --batch 32 --steps 5 --reps 3)
        samples[$row]+=" $(awk '{print $4}' <<<"$line")"
      done
    done
    {
      echo "# bench/multihost.sh: $hosts hosts x $per_host ranks, links $rate; bench/sharding's MLP"
      echo "# 4 x Linear(1024, 1024) (4.2 M parameters, 16 MiB), Adam, batch 32 per rank, overlapped,"
      echo "# one intra-op thread per rank; BLAS: $blas; 2 cores for all the hosts"
      echo "# each row: the median over $rounds rounds (rows taking turns) of each run's median repetition"
      printf '%-40s %12s %10s\n' "row" "ms per step" "/unsharded"
      unsharded=$(median "${samples[unsharded]}")
      for row in "${rows[@]}"; do
        case "$row" in
          unsharded) label="cohort distributed_optimizer, $ranks ranks" ;;
          *) label="cohort sharded ${row/stage/stage }, $ranks ranks" ;;
        esac
        ms=$(median "${samples[$row]}")
        printf '%-40s %12.2f %10.3f\n' "$label" "$ms" "$(awk -v a="$ms" -v b="$unsharded" 'BEGIN {print a / b}')"
      done
    } | tee "$out"
    # Its two collectives alone: reduces to the owners and copies from them, beside all-reduces.
    {
      echo "# bench/multihost.sh: $hosts hosts x $per_host ranks, links $rate"
      "$cluster" run "$per_host" "$build/bench/bench_reduce_to_owners" --mib 4 --tensors 4 --reps 7
    } | tee "$results/multihost-owners-$shape.txt"
  done
fi

if [ "$only" = powersgd ]; then
  # The bytes every host sent per step of COMMAND: run with ARG A and with ARG B (what the
  # program's step count grows by: STEPS per unit), the difference over the steps it added, so
  # that start-up, warm-up (DDP's uncompressed first steps) and timing barriers cancel.
  link_mb_per_step() { # ARG STEPS COMMAND...
    local arg=$1 steps=$2 b0 b1 b2
    shift 2
    b0=$("$cluster" bytes)
    "$@" "$arg" 1 >/dev/null 2>&1
    b1=$("$cluster" bytes)
    "$@" "$arg" 3 >/dev/null 2>&1
    b2=$("$cluster" bytes)
    awk -v a="$b0" -v b="$b1" -v c="$b2" -v s="$steps" \
      'BEGIN {printf "%.3f", ((c - b) - (b - a)) / (2 * s) / 1e6}'
  }
  ddp_env=(-x MASTER_ADDR=10.232.0.1 -x GLOO_SOCKET_IFNAME=eth0)
  for shape in ${POWERSGD_SHAPES:-2x2 4x1}; do
    hosts=${shape%x*} per_host=${shape#*x}
    with_hosts "$hosts"
    out=$results/multihost-powersgd-$shape.txt
    run=("$cluster" run "$per_host")
    {
      echo "# bench/multihost.sh: $hosts hosts x $per_host ranks, links $rate; ResNet-50's gradients; 2 cores for all the hosts"
      "${run[@]}" "$build/bench/bench_powersgd" --iters "$iters" 2>/dev/null
      echo "# PyTorch $("$python" -c 'import torch; print(torch.__version__)') DDP (gloo) on the same hosts, right after (bench/powersgd_ddp.py): ms per step"
      echo "# (zero_grad, forward, backward with the reduction), sync = that minus the step under no_sync(),"
      echo "# values sent per step as PyTorch counts them (compression_stats); PowerSGD in one bucket (see the script)"
      printf '# %-12s %10s %10s %14s %14s\n' row "step(ms)" "sync(ms)" "values sent" "of values"
      "${run[@]}" "${ddp_env[@]}" "$python" "$root/bench/powersgd_ddp.py" --from-mpi --iters "$iters" \
        2>/dev/null | awk '/^ddp-psgd/ {printf "  %-12s %10s %10s %14s %14s\n", $2, $3, $4, $5, $6}'
      echo "# the links: MB all hosts sent per step, headers included (tools/cluster.sh bytes: a run of 3"
      echo "# steps less a run of 1, over the 2 steps more; compressed steps only)"
      printf '  %-44s %s\n' "cohort mean" \
        "$(link_mb_per_step --iters 1 "${run[@]}" "$build/bench/bench_powersgd" --only "mean, flat")"
      printf '  %-44s %s\n' "cohort powersgd rank 4 (4 MiB buckets)" \
        "$(link_mb_per_step --iters 1 "${run[@]}" "$build/bench/bench_powersgd" --only "rank 4, flat, 4")"
      printf '  %-44s %s\n' "DDP (25 MiB buckets)" \
        "$(link_mb_per_step --iters 1 "${run[@]}" "${ddp_env[@]}" "$python" "$root/bench/powersgd_ddp.py" --from-mpi --rows mean)"
      printf '  %-44s %s\n' "DDP powerSGD_hook rank 4" \
        "$(link_mb_per_step --iters 1 "${run[@]}" "${ddp_env[@]}" "$python" "$root/bench/powersgd_ddp.py" --from-mpi --rows powersgd4)"
    } | tee "$out"
  done

  median() { tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g | awk '{v[NR]=$1} END {print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
  for shape in ${TORCH_SHAPES:-2x1 2x2}; do
    hosts=${shape%x*} per_host=${shape#*x}
    ranks=$((hosts * per_host))
    with_hosts "$hosts"
    out=$results/multihost-powersgd-torch_mlp-$shape.txt
    run=("$cluster" run "$per_host")
    rows=(blocking overlap psgd-blocking psgd-overlap ddp ddp-psgd)
    command_of() { # ROW: the command that runs it
      case "$1" in
        ddp) echo "${run[*]} ${ddp_env[*]} $python $root/bench/torch_mlp_ddp.py --from-mpi" ;;
        ddp-psgd) echo "${run[*]} ${ddp_env[*]} $python $root/bench/torch_mlp_ddp.py --from-mpi --powersgd 4" ;;
        psgd-*) echo "${run[*]} $build/bench/bench_torch_mlp --mode ${1#psgd-} --powersgd 4" ;;
        *) echo "${run[*]} $build/bench/bench_torch_mlp --mode $1" ;;
      esac
    }
    # Each run bounded: DDP with powerSGD_hook over gloo once spun forever here (100% of a core
    # for 11 minutes, no step done); a run that fails or hangs is counted, not timed.
    declare -A samples=() links=() failed=()
    for ((r = 1; r <= rounds; r++)); do
      for row in "${rows[@]}"; do
        read -ra command <<<"$(command_of "$row")"
        ms=$(timeout --kill-after=5 180 "${command[@]}" 2>/dev/null | grep -E '^(ddp|torch_mlp) ' |
          awk '{print $NF}' || true)
        if [ -n "$ms" ]; then
          samples[$row]+=" $ms"
        else
          failed[$row]=$((${failed[$row]:-0} + 1))
          pkill -f torch_mlp_ddp.py || true # (what a killed mpirun left on the hosts)
        fi
      done
    done
    for row in "${rows[@]}"; do # (20 steps a repetition)
      read -ra command <<<"$(command_of "$row")"
      links[$row]=$(link_mb_per_step --reps 20 timeout --kill-after=5 180 "${command[@]}")
    done
    {
      echo "# bench/multihost.sh: $hosts hosts x $per_host ranks, links $rate; the MLP 784-1024-1024-10 of"
      echo "# bench/torch_mlp (7.4 MB of gradients), batch 128 per rank, one intra-op thread per rank;"
      echo "# BLAS: $blas; 2 cores for all the hosts; PowerSGD rank 4 from step 2 (min_compression_rate 2)"
      echo "# each row: the median over $rounds rounds (rows taking turns) of each run's median repetition;"
      echo "# link: MB all hosts sent per step (tools/cluster.sh bytes: a run of 3 repetitions less a run of 1)"
      printf '%-52s %12s %10s %s\n' "row" "ms per step" "link MB" "runs that failed or hung"
      for row in "${rows[@]}"; do
        case "$row" in
          ddp) label="PyTorch DDP (gloo)" ;;
          ddp-psgd) label="PyTorch DDP (gloo), powerSGD_hook rank 4" ;;
          psgd-*) label="cohort ${row#psgd-}, powersgd rank 4" ;;
          *) label="cohort $row, mean" ;;
        esac
        printf '%-52s %12.2f %10.3f %s\n' "$label, $ranks ranks" "$(median "${samples[$row]:-0}")" \
          "${links[$row]}" "${failed[$row]:-0} of $rounds"
      done
      for row in psgd-blocking psgd-overlap; do
        echo "cohort ${row#psgd-} powersgd / DDP powersgd: $(awk -v a="$(median "${samples[$row]:-}")" -v b="$(median "${samples[ddp-psgd]:-}")" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else printf "n/a (a row without a run)"}')"
      done
    } | tee "$out"
    unset samples links failed
  done
fi

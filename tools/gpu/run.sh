#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the device kit (tools/gpu/pack.sh) on the machine it was carried to: Open MPI relocated
# into the kit, NCCL and LibTorch taken from that machine's PyTorch wheel. Every case is bounded
# and prints one line: PASS, FAIL or SKIP (and why). First the GPU, CUDA, NCCL and MPI in use; last
# `N passed, M failed`. The log, the results table and the benchmarks' tables go to $OUT (or
# KIT/out). Without a GPU every GPU case must say SKIP and the host cases pass (test/gpu/kit.sh
# checks that in CI, with Open MPI, Boost and xxHash hidden); exits 1 if any case failed.
#
#   tools/gpu/run.sh [KIT (gpu-kit)] [CASE_REGEX]
#
# COHORT_KIT_DEADLINE (480 s): the whole run's limit; a case gets what is left of it at most.
# COHORT_KIT_SWEEP_BYTES (1 GiB): the largest size bench_gpu_kernels checks (most of its time).
# COHORT_KIT_EXPECT_GPU=1: fail if CUDA sees no GPU (implied where /dev/nvidiactl exists).
set -uo pipefail
kit=$(realpath "${1:-gpu-kit}")
only=${2:-.}
out=${OUT:-$kit/out}
mkdir -p "$out"
log=$out/log.txt
results=$out/results.md
: > "$log"
if [ ! -f "$kit/MANIFEST" ] || grep -q incomplete "$kit/MANIFEST"; then
  echo "run.sh: $kit is not a (complete) device kit (tools/gpu/pack.sh makes one)" >&2
  exit 2
fi

# Open MPI and PMIx from the kit, wherever it lies.
export OPAL_PREFIX=$kit/openmpi OPAL_EXEC_PREFIX=$kit/openmpi OPAL_BINDIR=$kit/openmpi/bin \
  OPAL_LIBDIR=$kit/lib OPAL_PKGLIBDIR=$kit/openmpi/lib/plugins \
  OPAL_DATADIR=$kit/openmpi/share OPAL_PKGDATADIR=$kit/openmpi/share/openmpi \
  OPAL_SYSCONFDIR=$kit/openmpi/etc
export PMIX_PREFIX=$kit/pmix PMIX_EXEC_PREFIX=$kit/pmix PMIX_LIBDIR=$kit/pmix/lib \
  PMIX_PKGLIBDIR=$kit/pmix/lib/pmix PMIX_DATADIR=$kit/pmix/share \
  PMIX_PKGDATADIR=$kit/pmix/share/pmix
export OMPI_MCA_mca_base_component_path=$kit/openmpi/lib/plugins
export PMIX_MCA_mca_base_component_path=$kit/pmix/lib/pmix
# One machine: shared memory and TCP on loopback; no cross-memory attach (a VM or container may
# refuse ptrace); ranks may outnumber cores and sleep when idle; root may launch.
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 \
  OMPI_MCA_hwloc_base_binding_policy=none OMPI_ALLOW_RUN_AS_ROOT=1 \
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_tcp_if_include=lo \
  OMPI_MCA_oob_tcp_if_include=lo
mpirun=$kit/openmpi/bin/mpirun

# NCCL: the machine's own, from its PyTorch's nvidia-nccl wheel, else the loader's (a CUDA
# toolkit with NCCL). LibTorch: that PyTorch's, if its version is the one the test was built
# against.
python_dir() {
  python3 -c "$1" 2>/dev/null | tail -n 1
}
nccl_dir=${COHORT_KIT_NCCL_DIR:-$(python_dir '
import glob, os, site
for d in site.getsitepackages():
    for f in sorted(glob.glob(os.path.join(d, "nvidia", "**", "libnccl.so.2"), recursive=True)):
        print(os.path.dirname(f))
')}
[ -n "$nccl_dir" ] && [ -e "$nccl_dir/libnccl.so.2" ] || nccl_dir=
if [ -z "$nccl_dir" ] && ! grep -q 'libnccl\.so\.2 ' <<<"$(/sbin/ldconfig -p 2>/dev/null)"; then
  echo "FAIL kit.nccl: no libnccl.so.2 here (not in a PyTorch nvidia-nccl wheel, not known to the loader; COHORT_KIT_NCCL_DIR names its folder)"
  echo "0 passed, 1 failed"
  exit 1
fi
torch_dir=
torch_note="the kit has no CUDA LibTorch test (pack.sh --torch-build)"
if [ -x "$kit/bin/test_gpu_torch" ]; then
  wanted=$(cat "$kit/torch-version.txt" 2>/dev/null || echo '?')
  have=$(python_dir 'import torch; print(torch.__version__)')
  if [ "$have" = "$wanted" ]; then
    torch_dir=$(python_dir 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  else
    torch_note="the test was built against LibTorch $wanted; this machine's PyTorch is ${have:-absent}"
  fi
fi
export LD_LIBRARY_PATH=$kit/lib${nccl_dir:+:$nccl_dir}${torch_dir:+:$torch_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

passed=0 failed=0 skipped=0
deadline=$((SECONDS + ${COHORT_KIT_DEADLINE:-480}))
echo "| case | result | seconds | detail |" > "$results"
echo "| --- | --- | ---: | --- |" >> "$results"
record() { # result name seconds detail
  local line detail=${4:-}
  case "$1" in
    PASS) passed=$((passed + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
  esac
  line="$1 $2${3:+ (${3} s)}${4:+: $4}"
  echo "$line"
  echo "$line" >> "$log"
  echo "| $2 | $1 | ${3:-} | ${detail//|/\\|} |" >> "$results"
}

# run NAME KIND(host|gpu) LIMIT_S DETAIL_REGEX COMMAND...: PASS on exit 0 (with the last line the
# regex picks, if any). Without a GPU, a GPU case that exits 77, or exits 0 or 1 saying that it
# found no device, is SKIP. With one, a skip is a FAIL: every case of the kit runs on one GPU.
# FAIL otherwise, with the output's last line. Each case is bounded by LIMIT_S and by what is
# left of the run's deadline.
run() {
  local name=$1 kind=$2 limit=$3 pick=$4
  shift 4
  [[ "$name" =~ $only ]] || return 0
  local file=$out/case.txt start end rc seconds detail left=$((deadline - SECONDS))
  if [ "$left" -lt 10 ]; then
    record FAIL "$name" "" "not run: the run's deadline (COHORT_KIT_DEADLINE) has passed"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  start=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" > "$file" 2>&1
  rc=$?
  end=$(date +%s.%N)
  seconds=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
  { echo "==== $name: $*"; cat "$file"; echo "==== $name: exit $rc"; } >> "$log"
  detail=
  [ -n "$pick" ] && detail=$(grep -E "$pick" "$file" | tail -n 1)
  if [ "$kind" = gpu ] && [ "$gpus" = 0 ] &&
     { [ "$rc" = 77 ] || { [ "$rc" -le 1 ] && grep -qE "$no_device" "$file"; }; }; then
    record SKIP "$name" "" "$(grep -m 1 -iE "skipped|$no_device" "$file" | sed 's/^# //')"
  elif [ "$rc" = 77 ] || { [ "$kind" = gpu ] && grep -qE "$no_device" "$file"; }; then
    record FAIL "$name" "$seconds" "skipped on a machine with a GPU: $(grep -m 1 -iE "skipped|$no_device" "$file")"
  elif [ "$rc" = 0 ] && [ -n "$pick" ] && [ -z "$detail" ]; then
    record FAIL "$name" "$seconds" "exit 0, but no line matching '$pick' (its result) in the output"
  elif [ "$rc" = 0 ]; then
    record PASS "$name" "$seconds" "$detail"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record FAIL "$name" "$seconds" "timed out after $limit s"
  else
    record FAIL "$name" "$seconds" "exit $rc: $(grep -v '^\s*$' "$file" | tail -n 1)"
  fi
  cp "$file" "$out/last-case.txt"
  rm -f "$file"
}
# How a GPU program says that it found no device (bench_allreduce: it ran its host rows only).
no_device='no CUDA device visible|gpu rows: none'

# ---- what this machine has --------------------------------------------------------------------
echo "kit: $(head -n 1 "$kit/MANIFEST")"
info=$(timeout -k 5 60 "$mpirun" -np 1 "$kit/bin/bench_gpu_info" 2>&1)
info_rc=$?
echo "$info" >> "$log"
gpus=$(grep -c '^gpu: [0-9]' <<<"$info")
if [ "$info_rc" != 0 ]; then
  echo "FAIL kit.runtime: the kit's first program did not run under its mpirun (exit $info_rc):"
  echo "$info" | tail -n 20
  echo "0 passed, 1 failed"
  exit 1
fi
echo "$info" | grep -E '^(gpu|cuda|nccl|mpi|kernel)'
# A machine with an NVIDIA device whose CUDA sees none must not pass with every GPU case skipped.
if [ "$gpus" = 0 ] && { [ -e /dev/nvidiactl ] || [ -n "${COHORT_KIT_EXPECT_GPU:-}" ]; }; then
  echo "FAIL kit.gpu: this machine has an NVIDIA device (/dev/nvidiactl) but CUDA sees none: $(grep '^gpu:' <<<"$info")"
  echo "0 passed, 1 failed"
  exit 1
fi
default_nccl="the loader's default"
echo "nccl library: ${nccl_dir:-$default_nccl}; libtorch: ${torch_dir:-none ($torch_note)}"
{
  echo "# cohort device kit, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo '```'
  echo "$info" | grep -E '^(gpu|cuda|nccl|mpi|kernel)'
  head -n 3 "$kit/MANIFEST"
  echo '```'
  echo
} > "$out/header.md"
cuda_aware=$(sed -n 's/^mpi cuda-aware: //p' <<<"$info")

# ---- host cases: the kit's runtime works ------------------------------------------------------
bin=$kit/bin
run kernels.host host 120 '' "$bin/test_kernels_host"
run without_device.np2 host 120 '' env COHORT_RANKS_PER_NODE=1 "$mpirun" -np 2 "$bin/test_gpu_without_device"

# ---- the kernels ------------------------------------------------------------------------------
run gpu.instantiate gpu 60 '' "$bin/test_gpu_instantiate"
run gpu.kernels gpu 120 '' "$bin/test_gpu_kernels"
run gpu.kernels.sweep gpu 300 '^checks:' "$bin/bench_gpu_kernels" ${COHORT_KIT_SWEEP_BYTES:+--max-bytes "$COHORT_KIT_SWEEP_BYTES"}
[ -s "$out/last-case.txt" ] && grep -q '^# speed' "$out/last-case.txt" && cp "$out/last-case.txt" "$out/kernels.txt"

# ---- every GPU strategy at 1 rank -------------------------------------------------------------
run gpu.strategies.np1 gpu 180 '' "$mpirun" -np 1 "$bin/test_gpu_strategies"
run gpu.distributed_optimizer.np1 gpu 120 '' "$mpirun" -np 1 "$bin/test_gpu_distributed_optimizer"

# ---- host_staged and cuda_aware_flat at 2 and 3 ranks sharing the GPU -------------------------
for n in 2 3; do
  run "gpu.strategies.mpi_on_device.np$n" gpu 180 '' env COHORT_TEST_SHARED_DEVICE=1 "$mpirun" -np "$n" "$bin/test_gpu_strategies" --run_test=@mpi_on_device
  run "gpu.distributed_optimizer.mpi_on_device.np$n" gpu 120 '' env COHORT_TEST_SHARED_DEVICE=1 "$mpirun" -np "$n" "$bin/test_gpu_distributed_optimizer" --run_test=@mpi_on_device
done
if [ "$cuda_aware" != yes ]; then
  for n in 2 3; do
    [[ "gpu.cuda_aware_flat.np$n" =~ $only ]] &&
      record SKIP "gpu.cuda_aware_flat.np$n" "" "this Open MPI is not CUDA-aware (MPIX_Query_cuda_support is 0): cuda_aware_flat's refusal was checked instead"
  done
fi

# ---- examples/gpu_mlp -------------------------------------------------------------------------
run gpu.gpu_mlp.pure_nccl.np1 gpu 180 'accuracy' "$mpirun" -np 1 "$bin/gpu_mlp" --strategy pure_nccl
run gpu.gpu_mlp.host_staged.np2 gpu 180 'accuracy' "$mpirun" -np 2 "$bin/gpu_mlp" --strategy host_staged

# ---- CUDA LibTorch ----------------------------------------------------------------------------
if [ -n "$torch_dir" ]; then
  run gpu.torch.np1 gpu 240 '' "$mpirun" -np 1 "$bin/test_gpu_torch"
  run gpu.torch.mpi_on_device.np2 gpu 240 '' env COHORT_TEST_SHARED_DEVICE=1 "$mpirun" -np 2 "$bin/test_gpu_torch" --run_test=@mpi_on_device
else
  for c in gpu.torch.np1 gpu.torch.mpi_on_device.np2; do
    [[ "$c" =~ $only ]] && record SKIP "$c" "" "$torch_note"
  done
fi

# ---- the benchmarks' GPU rows: pure_nccl against one ncclAllReduce ------------------------------
run gpu.bench.allreduce.np1 gpu 240 'gpu pure_nccl' "$mpirun" -np 1 "$bin/bench_allreduce" --min-bytes 1MiB --max-bytes 256MiB --only 'raw,gpu raw nccl,gpu pure_nccl,gpu host_staged'
grep -q '^# gpu: ' "$out/last-case.txt" 2>/dev/null && cp "$out/last-case.txt" "$out/allreduce.txt"
rm -f "$out/last-case.txt"

{ cat "$out/header.md"; cat "$results"; } > "$out/results.tmp" && mv "$out/results.tmp" "$results"
rm -f "$out/header.md"
if [ $((passed + failed + skipped)) = 0 ]; then
  record FAIL kit.cases "" "no case matches '$only'"
fi
echo "$skipped skipped"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What including cohort costs a trainer's build: the time to compile (-O2, to an object file) the
# translation unit a trainer's main is -- <cohort/cohort.hpp>, make_communicator<flat>() and one
# allreduce_grad -- side by side with one that includes <boost/mpi.hpp>, makes an environment and
# does one all_reduce, and their ratio (this machine's speed varies threefold from hour to hour:
# the ratio, measured in one run, is what compares); and, where nvcc and NCCL are found, a
# translation unit with <cohort/nccl.hpp> and one pure_nccl allreduce_grad beside one with
# <nccl.h> and <cuda_runtime.h> alone. Both cohort rows are measured twice: header-only (the
# default: the engine is compiled in the translation unit) and with COHORT_SEPARATE_COMPILATION
# (it is compiled once per program, in the translation unit that includes <cohort/src.hpp>, whose
# own time is printed too). The host trainer is measured again, both ways, including only the
# headers it uses (<cohort/communicator/flat.hpp>, <cohort/reducer/mean.hpp>,
# <cohort/tensor/std.hpp>) instead of the umbrella. Each row is the median of --runs compilations
# (default 3), the rows taking turns so that a busy machine slows them alike.
#
#   bench/compile_time.sh [--runs N] [--cxx g++] [--no-gpu]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=3
cxx=${CXX:-g++}
gpu=1
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --cxx) cxx=$2; shift 2 ;;
    --no-gpu) gpu=0; shift ;;
    *) sed -n '3,17p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/boost_mpi.cpp" <<'EOF'
#include <boost/mpi.hpp>
#include <functional>
#include <vector>
int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv};
  boost::mpi::communicator comm;
  std::vector<float> g(1000, 1.0f), out(g.size());
  boost::mpi::all_reduce(comm, g.data(), static_cast<int>(g.size()), out.data(), std::plus<float>());
  return out[0] > 0 ? 0 : 1;
}
EOF
cat >"$work/cohort.cpp" <<'EOF'
#include <cohort/cohort.hpp>
#include <vector>
int main(int argc, char** argv) {
  boost::mpi::environment env{argc, argv};
  auto comm = cohort::make_communicator<cohort::flat>();
  std::vector<float> w(1000, 1.0f), g(1000, 1.0f);
  std::vector<cohort::parameter_ref<std::vector<float>>> params{{"w", &w, &g}};
  comm.allreduce_grad(params, cohort::mean{});
  return g[0] > 0 ? 0 : 1;
}
EOF
# The same trainer, including only the headers it uses instead of the umbrella.
{
  printf '#include <%s>\n' cohort/communicator/flat.hpp cohort/reducer/mean.hpp cohort/tensor/std.hpp \
    boost/mpi/environment.hpp
  tail -n +2 "$work/cohort.cpp"
} >"$work/cohort_lean.cpp"
cat >"$work/src.cpp" <<'EOF'
#include <cohort/src.hpp>
EOF
cat >"$work/nccl_only.cu" <<'EOF'
#include <cuda_runtime.h>
#include <nccl.h>
void reduce(ncclComm_t comm, float* g, size_t n, cudaStream_t s) {
  ncclAllReduce(g, g, n, ncclFloat, ncclSum, comm, s);
}
EOF
cat >"$work/cohort_nccl.cu" <<'EOF'
#include <cohort/nccl.hpp>
#include <vector>
void reduce(cohort::pure_nccl& comm,
            std::vector<cohort::parameter_ref<cohort::device_span<float>>>& params) {
  comm.allreduce_grad(params, cohort::mean{});
}
EOF

mpi_flags=$(mpicxx --showme:compile)
host_flags=(-std=c++20 -O2 -c -I"$root/include" $mpi_flags)

# compile NAME COMMAND...: appends one time in seconds to $work/NAME.
compile() {
  local name=$1
  shift
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null
  end=$(date +%s.%N)
  echo "$end - $start" | bc >>"$work/$name"
}

median() { sort -g "$work/$1" | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

rows=(boost_mpi cohort)
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ "$gpu" -eq 1 ] && [ -x "$nvcc" ] && [ -e /usr/local/cuda/include/nccl.h -o -e /usr/include/nccl.h ]; then
  rows+=(nccl_only cohort_nccl)
else
  gpu=0
fi
gpu_flags=(-std=c++20 -O2 -c -arch=sm_80 -I"$root/include" $mpi_flags)

for ((i = 0; i < runs; ++i)); do
  compile boost_mpi "$cxx" "${host_flags[@]}" "$work/boost_mpi.cpp" -o "$work/a.o"
  compile cohort "$cxx" "${host_flags[@]}" "$work/cohort.cpp" -o "$work/b.o"
  compile cohort_separate "$cxx" "${host_flags[@]}" -DCOHORT_SEPARATE_COMPILATION "$work/cohort.cpp" -o "$work/b2.o"
  compile cohort_lean "$cxx" "${host_flags[@]}" "$work/cohort_lean.cpp" -o "$work/b5.o"
  compile cohort_lean_separate "$cxx" "${host_flags[@]}" -DCOHORT_SEPARATE_COMPILATION "$work/cohort_lean.cpp" -o "$work/b4.o"
  compile cohort_src "$cxx" "${host_flags[@]}" -DCOHORT_SEPARATE_COMPILATION "$work/src.cpp" -o "$work/b3.o"
  if [ "$gpu" -eq 1 ]; then
    compile nccl_only "$nvcc" "${gpu_flags[@]}" "$work/nccl_only.cu" -o "$work/c.o"
    compile cohort_nccl "$nvcc" "${gpu_flags[@]}" "$work/cohort_nccl.cu" -o "$work/d.o"
    compile cohort_nccl_separate "$nvcc" "${gpu_flags[@]}" -DCOHORT_SEPARATE_COMPILATION "$work/cohort_nccl.cu" -o "$work/d2.o"
  fi
done

printf '%-52s %10s  %6s\n' "translation unit (-O2, median of $runs)" "seconds" "ratio"
printf '%-52s %10.2f\n' "<boost/mpi.hpp>, one all_reduce" "$(median boost_mpi)"
ratio() { echo "scale=2; $(median "$1") / $(median boost_mpi)" | bc; }
printf '%-52s %10.2f  %5.2fx\n' "<cohort/cohort.hpp>, make_communicator, allreduce_grad" "$(median cohort)" "$(ratio cohort)"
printf '%-52s %10.2f  %5.2fx\n' "  the same, COHORT_SEPARATE_COMPILATION" "$(median cohort_separate)" "$(ratio cohort_separate)"
printf '%-52s %10.2f  %5.2fx\n' "  the same, only flat.hpp, mean.hpp and std.hpp" "$(median cohort_lean_separate)" "$(ratio cohort_lean_separate)"
printf '%-52s %10.2f  %5.2fx\n' "  only those three headers, header-only" "$(median cohort_lean)" "$(ratio cohort_lean)"
printf '%-52s %10.2f\n' "  <cohort/src.hpp> (once per program)" "$(median cohort_src)"
if [ "$gpu" -eq 1 ]; then
  printf '%-52s %10.2f\n' "<nccl.h> + <cuda_runtime.h>, one ncclAllReduce (nvcc)" "$(median nccl_only)"
  nccl_ratio() { echo "scale=2; $(median "$1") / $(median nccl_only)" | bc; }
  printf '%-52s %10.2f  %5.2fx\n' "<cohort/nccl.hpp>, one pure_nccl allreduce_grad" "$(median cohort_nccl)" "$(nccl_ratio cohort_nccl)"
  printf '%-52s %10.2f  %5.2fx\n' "  the same, COHORT_SEPARATE_COMPILATION" "$(median cohort_nccl_separate)" "$(nccl_ratio cohort_nccl_separate)"
fi

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Set-up and everyday commands on a fresh Debian (or Ubuntu) machine. Each command first installs
# what is missing (apt packages), then configures and builds in ./build.
#
#   tools/dev.sh example   build and train examples/mnist_mlp on 2 ranks
#   tools/dev.sh test      build and run the whole test suite (what CI runs after docs)
#   tools/dev.sh sanitize [thread|address|fuzz|thread-engine|address-engine]...
#                          build the test suites with ThreadSanitizer, then with
#                          AddressSanitizer + UndefinedBehaviorSanitizer, and run them under
#                          mpirun, then fuzz the checkpoint loader for COHORT_FUZZ_SECONDS (30)
#                          (tools/fuzz.sh) (what CI runs next); suppressions for Open MPI in
#                          test/sanitizers; *-engine: without the LibTorch programs
#   tools/dev.sh bench [allreduce|grad_sync|overlap|checkpoint] [options]
#                          build and run a benchmark (default allreduce) on 2 ranks
#   tools/dev.sh bench plot
#                          run the benchmarks behind docs/performance.md at 2 and 4 ranks into
#                          bench/results/plot-*.txt, draw its figures and check the cost model
#   tools/dev.sh docs [serve]
#                          build the documentation site (mkdocs.yml: the guide in docs/, the API
#                          reference from the headers' //! comments through Doxygen) in strict
#                          mode into build/site, with MkDocs from PyPI in .venv (what CI runs
#                          first); serve: serve it on http://127.0.0.1:8000 as you edit
#   tools/dev.sh cluster up N [--rate R] | run K PROGRAM | down | ...
#                          simulated hosts on this machine (tools/cluster.sh, docs/multihost.md)
#   tools/dev.sh gpu-pack [TORCH_VERSION]
#                          build the device kit into gpu-kit/ (tools/gpu/pack.sh: the GPU tests,
#                          examples/gpu_mlp, the GPU benchmarks and CUDA LibTorch's test against
#                          PyPI's torch TORCH_VERSION, default 2.11.0, the device machine's, with
#                          the runtime a bare GPU machine lacks); tools/gpu/run.sh runs it there
#                          (docs/gpu.md)
#   tools/dev.sh deps      only install the packages
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${COHORT_BUILD_DIR:-$root/build}
jobs=$(nproc 2>/dev/null || echo 2)
# ctest's slots: twice the cores. A multi-rank test takes two (PROCESSORS 2), so two jobs run at
# once: they wait (for mpirun's start, a peer, a fault's timeout) more than they compute, and one
# at a time left the cores 50-80% idle.
test_jobs=$((2 * jobs))

# libeigen3-dev and libtorch-dev (LibTorch 1.13, CPU) so that the adapters are always tested,
# libxxhash-dev for checkpoints, clang-14 and its libFuzzer runtime to fuzz their loader,
# numpy and matplotlib for bench/'s figures and cost model (and their test), doxygen for the
# documentation's API reference (python3-venv holds the documentation's Python packages),
# iproute2 for tools/cluster.sh's simulated hosts (the multihost tests).
# ccache, so that a second build of the same sources (another clone on the same machine, CI after
# a session) compiles only what changed.
packages=(g++ cmake make pkg-config python3-venv openmpi-bin libopenmpi-dev libboost-mpi-dev libboost-test-dev
          libboost-serialization-dev libeigen3-dev libtorch-dev libxxhash-dev clang-14
          libclang-rt-14-dev python3-numpy python3-matplotlib ccache doxygen iproute2)

deps() {
  stage_begin packages
  install_missing
  stage_end
  compiler_cache
}
# The packages named, or all of them.
install_missing() {
  local wanted=("$@") missing=()
  [ ${#wanted[@]} -eq 0 ] && wanted=("${packages[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
}

# Each stage's wall time, appended to $COHORT_STAGE_LOG where it is set (.ci/run prints them as a
# table): "command: stage<TAB>seconds<TAB>ok|failed". A stage that fails is logged by the EXIT trap.
command=${1:-}
stage_name=
stage_begin() {
  stage_name=$1
  stage_start=$SECONDS
}
stage_end() {
  if [ -n "$stage_name" ] && [ -n "${COHORT_STAGE_LOG:-}" ]; then
    printf '%s: %s\t%s\t%s\n' "${command:-}" "$stage_name" "$((SECONDS - stage_start))" "${1:-ok}" \
      >>"$COHORT_STAGE_LOG"
  fi
  stage_name=
}
trap 'stage_end failed' EXIT

# ccache where it is installed (COHORT_CCACHE=0 turns it off): paths taken relative to the
# checkout (and the debug information's directory not hashed), so that another clone of the same
# sources hits the same entries. Exported too, so that the projects the tests configure (the
# package consumers, Conan's test_package) compile through it as well.
# Decided after the packages are installed (deps), since ccache is one of them.
launchers=()
compiler_cache() {
  if [ "${COHORT_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
    export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
    # What ccache needs to cache the translation units that use a precompiled header (the
    # LibTorch programs: cmake/cohort-torch-pch.cmake): the header is made just before them.
    export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
    export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
    launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  else
    unset CMAKE_CXX_COMPILER_LAUNCHER CMAKE_CUDA_COMPILER_LAUNCHER
    launchers=(-UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
  fi
}

# One build directory for every command: each configures the same way and builds what it needs.
configure_and_build() {
  stage_begin configure
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCOHORT_BUILD_TESTS=ON \
    -DCOHORT_BUILD_EXAMPLES=ON -DCOHORT_BUILD_BENCHMARKS=ON "${launchers[@]}"
  stage_end
  stage_begin build
  cmake --build "$build" -j "$jobs" "$@"
  stage_end
}

# mpirun on a machine with fewer cores than ranks, possibly as root (CI containers): allow
# oversubscription and let idle ranks yield the core instead of busy-polling.
mpi_environment() {
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
}

# The documentation's Python packages in .venv, installed again only when docs/requirements.txt
# changed (a copy of it in the environment says what was installed).
docs_environment() {
  venv=$root/.venv
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  if ! cmp -s "$root/docs/requirements.txt" "$venv/docs-requirements.txt"; then
    echo "installing docs/requirements.txt into $venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      -r "$root/docs/requirements.txt"
    cp "$root/docs/requirements.txt" "$venv/docs-requirements.txt"
  fi
}

case "${1:-}" in
  deps) deps ;;
  docs)
    shift
    stage_begin packages
    install_missing python3-venv doxygen
    docs_environment
    stage_end
    # mkdocs.yml's paths (the headers, Doxygen's output, the site) are the checkout's. Doxygen's
    # output goes first: mkdoxy reuses it while the headers' bytes hash the same, and a header
    # moved or mkdocs.yml changed would then keep the old pages.
    cd "$root"
    rm -rf "$root/build/doxygen"
    if [ "${1:-}" = serve ]; then
      shift
      exec "$venv/bin/mkdocs" serve --strict "$@"
    fi
    # Never --quiet: it drops the warnings before strict mode counts them, and the build passes.
    stage_begin build
    "$venv/bin/mkdocs" build --strict --clean "$@"
    stage_end
    echo "the site: $root/build/site/index.html"
    ;;
  cluster)
    # tools/cluster.sh's simulated hosts (docs/multihost.md), iproute2 installed first.
    shift
    install_missing iproute2
    exec "$root/tools/cluster.sh" "$@"
    ;;
  gpu-pack)
    deps
    configure_and_build
    torch_version=${2:-2.11.0}
    torch_work=${TMPDIR:-/tmp}/cohort-torch-$torch_version
    "$root/tools/torch-wheel.sh" "$torch_work" "==$torch_version" --build-only test_gpu_torch
    exec "$root/tools/gpu/pack.sh" --no-build --build "$build" --torch-build "$torch_work/build"
    ;;
  example)
    deps
    configure_and_build --target mnist_mlp
    mpi_environment
    shift
    mpirun -np 2 "$build/examples/mnist_mlp" "$@"
    ;;
  test)
    deps
    configure_and_build
    mpi_environment
    cd "$build"
    stage_begin test
    ctest --output-on-failure -j "$test_jobs" --timeout 900
    stage_end
    ;;
  sanitize)
    shift
    deps
    mpi_environment
    kinds=("$@")
    [ ${#kinds[@]} -eq 0 ] && kinds=(thread address fuzz)
    supp="$root/test/sanitizers"
    export TSAN_OPTIONS="suppressions=$supp/tsan.supp halt_on_error=1 exitcode=66 second_deadlock_stack=1"
    # Full stacks for the leak check, so that Open MPI's allocations are told apart by library
    # (the fast unwinder stops in code built without frame pointers), and Open MPI's plugins kept
    # loaded so that their frames have names.
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:exitcode=66:fast_unwind_on_malloc=0"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:fast_unwind_on_malloc=0"
    export OMPI_MCA_mca_base_component_disable_dlclose=1
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66"
    for kind in "${kinds[@]}"; do
      case "$kind" in
        fuzz)
          stage_begin fuzz
          # A fixed time (COHORT_FUZZ_SECONDS), or a run count where COHORT_FUZZ_RUNS is set.
          limit=(--seconds "${COHORT_FUZZ_SECONDS:-30}")
          [ -n "${COHORT_FUZZ_RUNS:-}" ] && limit=(--runs "$COHORT_FUZZ_RUNS")
          "$root/tools/fuzz.sh" "${limit[@]}"
          stage_end
          continue
          ;;
      esac
      # thread-engine, address-engine: without the LibTorch programs (COHORT_WITH_TORCH=OFF; their
      # jobs are skipped), the narrower plan .ci/run takes in a slow hour (docs/ci.md).
      with_torch=ON
      case "$kind" in *-engine) with_torch=OFF ;; esac
      case "${kind%-engine}" in
        thread) flags="-fsanitize=thread" torch_options= ;;
        # (UBSan not in the LibTorch test programs: test/CMakeLists.txt says why)
        address) flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
          torch_options=-fno-sanitize=undefined ;;
        *) echo "unknown sanitizer '$kind' (thread, address, thread-engine, address-engine or fuzz)"
          exit 2 ;;
      esac
      dir="$root/build-${kind%-engine}"
      # The suites against the engine compiled once (COHORT_TEST_SEPARATE_COMPILATION, in
      # test/CMakeLists.txt): the same code, instrumented, in half the compile time; their jobs'
      # time bounds three times the Release ones (COHORT_TEST_TIME_SCALE).
      stage_begin "$kind: build"
      cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DCOHORT_BUILD_TESTS=ON \
        -DCOHORT_BUILD_EXAMPLES=OFF -DCOHORT_BUILD_BENCHMARKS=OFF -DCOHORT_WITH_CUDA=OFF \
        -DCOHORT_TEST_SEPARATE_COMPILATION=ON -DCOHORT_TEST_TIME_SCALE=3 \
        "-DCOHORT_WITH_TORCH=$with_torch" "-DCOHORT_TEST_TORCH_OPTIONS=$torch_options" \
        "-DCMAKE_CXX_FLAGS=-O1 -g1 -fno-omit-frame-pointer $flags" \
        "-DCMAKE_EXE_LINKER_FLAGS=$flags" "${launchers[@]}"
      cmake --build "$dir" -j "$jobs" --target test_programs
      stage_end
      # Every suite of test/ that runs cohort's code (the header, package and compile-fail tests
      # compile it, the GPU tests need nvcc, and the examples are not built here), the suites
      # across simulated hosts too (multihost.suites). A job run at 3 ranks is not run at 2 as
      # well, nor one run at 4 ranks on 2 simulated nodes (.2x2) at 4 on one: the main stage runs
      # them all; here, 3 ranks run the same engine code (a race or a bad access seldom depends
      # on the count) and the uneven paths besides. It saves a third of the sanitizers' test
      # time (docs/ci.md). So, too, for two 4-rank jobs whose cases run at 3 ranks as well: the
      # trace (communicator.trace.np3) and the LibTorch data side (adapters.torch.np3): 47 s of
      # AddressSanitizer's test time.
      stage_begin "$kind: test"
      (cd "$dir" && suites='^(tensor|kernels|reducer|transport|algorithm|communicator|training|adapters|checkpoint|support|multihost)\.' &&
        tests=$(ctest -N -R "$suites" | sed -n 's/^ *Test *#[0-9]*: //p') &&
        twice=$({ grep -E '\.np[24]$' <<<"$tests" || true; } | while read -r t; do
                  case "$t" in
                    *.np2) if grep -qxF "${t%.np2}.np3" <<<"$tests"; then echo "$t"; fi ;;
                    *.np4) if grep -qxF "${t%.np4}.2x2" <<<"$tests"; then echo "$t"; fi ;;
                  esac
                done | sed 's/\./\\./g' | paste -sd'|' -) &&
        twice="${twice:+$twice|}communicator\.trace\.np4|adapters\.torch_sampler\.np4" &&
        ctest --output-on-failure -j "$test_jobs" --timeout 600 -R "$suites" \
          ${twice:+-E "^($twice)\$"})
      stage_end
    done
    ;;
  bench)
    shift
    benchmark=allreduce
    case "${1:-}" in
      plot)
        deps
        configure_and_build --target bench_allreduce bench_grad_sync bench_overlap
        mpi_environment
        # Open MPI as users run it: its single-copy transport back on (the tests turn it off,
        # since containers often forbid the ptrace it needs).
        unset OMPI_MCA_btl_vader_single_copy_mechanism
        # ranks, benchmark, table name, options
        table() {
          mpirun -np "$1" "$build/bench/bench_$2" "${@:4}" >"$root/bench/results/plot-$3-np$1.txt"
        }
        for n in 2 4; do
          table "$n" allreduce allreduce
          table "$n" allreduce allreduce16k --tensor-bytes 16K --max-bytes 64M
          table "$n" grad_sync grad_sync
          table "$n" overlap overlap
        done
        /usr/bin/python3 "$root/bench/plot.py"
        /usr/bin/python3 "$root/bench/cost_model.py" | tee "$root/bench/results/cost_model.txt"
        exit 0
        ;;
      allreduce | grad_sync | overlap | checkpoint)
        benchmark=$1
        shift
        ;;
    esac
    deps
    if [ "$benchmark" = checkpoint ]; then
      configure_and_build --target bench_checkpoint
      mpi_environment
      exec "$root/bench/checkpoint.sh" --build "$build" "$@"
    fi
    configure_and_build --target "bench_$benchmark"
    mpi_environment
    mpirun -np "${COHORT_BENCH_RANKS:-2}" "$build/bench/bench_$benchmark" "$@"
    ;;
  *)
    sed -n '3,24p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fuzzes what cohort reads from a checkpoint (test/fuzz/checkpoint_loader.cpp) with clang's
# libFuzzer under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer, from a
# corpus of valid inputs it writes first. Any crash, leak, sanitizer report, or single allocation
# over 64 MB (the inputs are at most 4 KB: such an allocation is one the bytes did not pay for)
# fails the run. CI fuzzes for a fixed time (a run count would take as long as the machine is slow
# that hour); before a release, run a million or more.
#
#   tools/fuzz.sh [--runs N | --seconds S] [--work DIR]   (defaults: 100000 runs, /tmp/cohort-fuzz)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
runs=100000
seconds=
work=/tmp/cohort-fuzz
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; seconds=; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) sed -n '3,10p' "${BASH_SOURCE[0]}"; exit 2 ;;
  esac
done
clang=${COHORT_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++)}
# Compiled (through ccache where tools/dev.sh set it up, so that a warm CI run does not compile
# the loader twice again: ccache caches compiling, not linking) and linked apart.
launcher=()
[ -n "${CCACHE_BASEDIR:-}" ] && command -v ccache > /dev/null && launcher=(ccache)
source=$root/test/fuzz/checkpoint_loader.cpp
flags=(-std=c++20 -g -O1 -I"$root/include" -Wall -Wextra -Werror)
mkdir -p "$work/corpus"

"${launcher[@]}" "$clang" "${flags[@]}" -DCOHORT_FUZZ_SEEDS -c "$source" -o "$work/seeds.o"
"$clang" "$work/seeds.o" -o "$work/seeds"
"$work/seeds" "$work/corpus"
sanitizers=(-fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
"${launcher[@]}" "$clang" "${flags[@]}" "${sanitizers[@]}" -c "$source" -o "$work/checkpoint_loader.o"
"$clang" "${sanitizers[@]}" "$work/checkpoint_loader.o" -o "$work/checkpoint_loader"
# One process, as many runs or seconds as asked: libFuzzer prints its statistics and stops at the
# first finding with a non-zero exit code (and the input that found it in $work).
limit=(-runs="$runs")
[ -n "$seconds" ] && limit=(-max_total_time="$seconds")
(cd "$work" && ./checkpoint_loader "${limit[@]}" -malloc_limit_mb=64 -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 corpus)

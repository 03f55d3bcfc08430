#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# usage: compare_ranks.sh MPIEXEC NUMPROC_FLAG MNIST_MLP [mnist_mlp options...]
#
# Trains mnist_mlp on 1 rank and on 2 ranks with the same global batch, and fails unless both
# reach a sane test accuracy and the two agree within a tolerance. They are not bit-identical:
# the shards put different examples in each step, so only the statistics must match.

set -u

tolerance=0.02
floor=0.8

if [ "$#" -lt 3 ]; then
  echo "usage: $0 MPIEXEC NUMPROC_FLAG MNIST_MLP [mnist_mlp options...]" >&2
  exit 2
fi
mpiexec=$1
numproc_flag=$2
program=$3
shift 3

# Runs the program on $1 ranks and sets $accuracy from its one "test accuracy:" line.
run() {
  ranks=$1
  shift
  echo "compare_ranks: $mpiexec $numproc_flag $ranks $program $*"
  output=$("$mpiexec" "$numproc_flag" "$ranks" "$program" "$@")
  status=$?
  printf '%s\n' "$output"
  if [ "$status" -ne 0 ]; then
    echo "compare_ranks: FAILED: $(basename "$program") on $ranks rank(s) exited with status $status" >&2
    exit 1
  fi
  lines=$(printf '%s\n' "$output" | grep -c '^test accuracy: ')
  if [ "$lines" -ne 1 ]; then
    echo "compare_ranks: FAILED: $(basename "$program") on $ranks rank(s) printed $lines 'test accuracy:' lines, expected 1" >&2
    exit 1
  fi
  accuracy=$(printf '%s\n' "$output" | sed -n 's/^test accuracy: \([0-9][0-9.]*\)$/\1/p')
  if [ -z "$accuracy" ]; then
    echo "compare_ranks: FAILED: cannot read the accuracy in the program's 'test accuracy:' line on $ranks rank(s)" >&2
    exit 1
  fi
}

run 1 "$@"
one_rank=$accuracy
run 2 "$@"
two_ranks=$accuracy

echo "compare_ranks: test accuracy $one_rank on 1 rank, $two_ranks on 2 ranks (tolerance $tolerance, floor $floor)"
# awk for the arithmetic: POSIX sh has none for decimals. The 1e-9 keeps a difference of exactly
# the tolerance (0.9400 - 0.9200) from failing on rounding.
awk -v a="$one_rank" -v b="$two_ranks" -v tol="$tolerance" -v floor="$floor" 'BEGIN {
  d = a - b; if (d < 0) d = -d
  if (a < floor || b < floor) {
    printf "compare_ranks: FAILED: test accuracy below the floor %s (1 rank: %s, 2 ranks: %s)\n", floor, a, b > "/dev/stderr"
    exit 1
  }
  if (d > tol + 1e-9) {
    printf "compare_ranks: FAILED: 1 and 2 ranks differ by %.4f in test accuracy, more than %s\n", d, tol > "/dev/stderr"
    exit 1
  }
  print "compare_ranks: passed"
}'

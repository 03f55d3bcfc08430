#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Which sanitizer stages .ci/run can afford after the README's stage (docs/ci.md, "A slow hour").
#
#   tools/ci-plan.sh MAIN LEFT          prints the plan: the `tools/dev.sh sanitize` kinds to run
#   tools/ci-plan.sh --cost KIND MAIN   prints one kind's estimated seconds
#
# MAIN: the seconds the README's stage took in this run (its build and its tests); LEFT: the
# seconds left of CI's budget. This machine's speed varies threefold from hour to hour and a run
# past CI's limit lands nothing, not even the suite that passed; each sanitizer stage costs about
# a fixed share of the README's stage, so MAIN tells how fast the machine is today. The plan is
# the widest of the list that fits; nothing fits: an empty line.
set -euo pipefail
usage() {
  echo "usage: $0 MAIN_SECONDS LEFT_SECONDS | --cost KIND MAIN_SECONDS" >&2
  exit 2
}
# Each kind's share of the README's stage, in hundredths, from cold runs in ordinary and slow
# hours (docs/ci.md), with a margin: ThreadSanitizer 33-35, AddressSanitizer 62-64, the fuzzer
# 4; without the LibTorch programs (whose translation units and jobs are the slowest) about 55%
# of the whole, an estimate.
declare -A share=([thread]=42 [address]=74 [thread-engine]=30 [address-engine]=46 [fuzz]=6)
# The plans, widest first.
plans=("thread address fuzz" "thread-engine address-engine fuzz" "address-engine fuzz" "fuzz")
cost() { # KIND MAIN
  [ -n "${share[$1]:-}" ] || usage
  echo $(($2 * ${share[$1]} / 100))
}
if [ "${1:-}" = --cost ]; then
  [ $# -eq 3 ] && [[ $3 =~ ^[0-9]+$ ]] || usage
  cost "$2" "$3"
  exit 0
fi
[ $# -eq 2 ] && [[ $1 =~ ^[0-9]+$ ]] && [[ $2 =~ ^-?[0-9]+$ ]] || usage
main=$1 left=$2
for plan in "${plans[@]}"; do
  total=0
  for kind in $plan; do
    total=$((total + $(cost "$kind" "$main")))
  done
  if [ "$total" -le "$left" ]; then
    echo "$plan"
    exit 0
  fi
done
echo

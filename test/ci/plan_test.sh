#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/ci-plan.sh: the sanitizer stages .ci/run takes for the time left (docs/ci.md).
#   plan_test.sh PATH_TO_CI_PLAN
set -uo pipefail
plan=$1
failures=0
expect() { # main left expected
  local got
  got=$("$plan" "$1" "$2")
  if [ "$got" != "$3" ]; then
    echo "FAIL: main $1 s, $2 s left: '$got', expected '$3'"
    failures=$((failures + 1))
  fi
}
# An ordinary hour (the README's stage 17 minutes, 68 left): everything.
expect 1008 4080 "thread address fuzz"
# The run CI stopped at 90 minutes (the README's stage 45 minutes, 39 left): both sanitizers
# without the LibTorch programs, not a run that lands nothing.
expect 2697 2360 "thread-engine address-engine fuzz"
# Slower still: AddressSanitizer alone, then the fuzzer alone, then nothing.
expect 3000 2050 "address-engine fuzz"
expect 4000 300 "fuzz"
expect 5000 100 ""
expect 1000 -5 ""
# The boundary belongs to the wider plan.
expect 1000 1220 "thread address fuzz"
expect 1000 1219 "thread-engine address-engine fuzz"
# One kind's estimate, which .ci/run compares with the time left before each stage.
[ "$("$plan" --cost thread 1000)" = 420 ] && [ "$("$plan" --cost address-engine 1000)" = 460 ] || {
  echo "FAIL: --cost"
  failures=$((failures + 1))
}
# Bad arguments: a usage error, not a plan.
if "$plan" 1000 >/dev/null 2>&1 || "$plan" x 10 >/dev/null 2>&1 ||
  "$plan" --cost bogus 10 >/dev/null 2>&1; then
  echo "FAIL: bad arguments were taken"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] && echo "ci-plan: all cases pass"
exit $((failures > 0))

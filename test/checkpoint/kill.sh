#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checkpoints against SIGKILL, in real jobs under mpirun, each bounded in time:
#
#   kill.sh job MPIEXEC RANKS EXAMPLE WORK [ARGS...]
#     an example (mnist_mlp, torch_mnist) run whole with ARGS (150 steps), then the same run with
#     checkpoints killed (SIGKILL to every process of the job) once one of step 20 or later is
#     complete, then started again with the same command: it must resume and end with the very
#     weights of the whole run (bit for bit).
#   kill.sh epoch MPIEXEC RANKS EXAMPLE WORK [ARGS...]
#     the same example run whole; then a run of its first epoch alone (--epochs 1) that saves
#     at its last step, the epoch's end; then the whole command again, which must resume at the
#     next epoch's start and end with the very weights of the whole run.
#   kill.sh rank MPIEXEC RANKS DIE_IN_SAVE WORK HOW
#     one rank killed in the middle of writing a checkpoint (HOW, see die_in_save.cpp: the last
#     rank in its file, the same on its async writer thread, or rank 0 in the manifest), or
#     throwing while an async save is in flight (`throw`): the job ends (not hangs), and the next
#     job resumes the checkpoint before, saying that it ignored the unfinished one.
set -euo pipefail
mode=$1 mpiexec=$2 ranks=$3 program=$4 work=$5
shift 5
rm -rf "$work"
mkdir -p "$work"
fail() { echo "kill.sh: $*" >&2; exit 1; }
# A job that must end within $1 seconds.
bounded() { local limit=$1; shift; timeout --kill-after=5 "$limit" "$@"; }

if [ "$mode" = job ]; then
  args=("$@")
  bounded 120 "$mpiexec" -n "$ranks" "$program" "${args[@]}" >"$work/whole.txt"
  whole=$(grep "final weights" "$work/whole.txt") || fail "the whole run printed no weights"

  ckpt=$work/checkpoints
  "$mpiexec" -n "$ranks" "$program" "${args[@]}" --checkpoint "$ckpt" --checkpoint-every 2 \
    >"$work/killed.txt" 2>&1 &
  job=$!
  # Killed once a checkpoint of step 20 or later is complete (of 150 steps).
  newest() {
    ls -d "$ckpt"/step-*/MANIFEST 2>/dev/null | sed 's|.*/step-0*\([0-9]*\)/MANIFEST|\1|' |
      sort -n | tail -n 1 || true
  }
  for _ in $(seq 1 2400); do
    n=$(newest)
    if [ -n "$n" ] && [ "$n" -ge 20 ]; then break; fi
    sleep 0.025
  done
  pkill -KILL -f -- "--checkpoint $ckpt" || true
  wait "$job" 2>/dev/null && fail "the job was not killed: it finished first"
  if grep -q "final weights" "$work/killed.txt"; then
    fail "the job finished before it was killed"
  fi
  echo "killed after: $(ls "$ckpt")"

  bounded 120 "$mpiexec" -n "$ranks" "$program" "${args[@]}" --checkpoint "$ckpt" \
    --checkpoint-every 2 >"$work/resumed.txt"
  cat "$work/resumed.txt"
  grep -q "resumed from step" "$work/resumed.txt" || fail "the second job did not resume"
  resumed=$(grep "final weights" "$work/resumed.txt")
  [ "$resumed" = "$whole" ] || fail "resumed: '$resumed'; whole run: '$whole'"
  echo "resumed run ends as the whole run: $whole"
elif [ "$mode" = epoch ]; then
  args=("$@")
  bounded 120 "$mpiexec" -n "$ranks" "$program" "${args[@]}" >"$work/whole.txt"
  whole=$(grep "final weights" "$work/whole.txt") || fail "the whole run printed no weights"
  ckpt=$work/checkpoints
  # (the last --epochs on the command line counts; 50 steps an epoch)
  bounded 120 "$mpiexec" -n "$ranks" "$program" "${args[@]}" --epochs 1 --checkpoint "$ckpt" \
    --checkpoint-every 50 >"$work/first-epoch.txt" || fail "the first epoch's run failed"
  ls -d "$ckpt"/step-*50 >/dev/null || fail "no checkpoint of step 50: $(ls "$ckpt")"
  bounded 120 "$mpiexec" -n "$ranks" "$program" "${args[@]}" --checkpoint "$ckpt" \
    --checkpoint-every 50 >"$work/resumed.txt" || fail "the resumed run failed"
  cat "$work/resumed.txt"
  grep -q "resumed from step 50 (epoch 2, after 0 of its steps)" "$work/resumed.txt" ||
    fail "the second job did not resume at the second epoch's start"
  resumed=$(grep "final weights" "$work/resumed.txt")
  [ "$resumed" = "$whole" ] || fail "resumed: '$resumed'; whole run: '$whole'"
  echo "resumed at an epoch's end, ends as the whole run: $whole"
elif [ "$mode" = rank ]; then
  status=0
  bounded 60 "$mpiexec" -n "$ranks" "$program" save "$work/checkpoints" "$1" >"$work/died.txt" 2>&1 ||
    status=$?
  [ "$status" -ne 0 ] || fail "the job with a killed rank succeeded: $(cat "$work/died.txt")"
  [ "$status" -ne 124 ] || fail "the job hung after a rank was killed"
  echo "the job with a killed rank ended with status $status"
  # Killed where it was meant to be: in the manifest, or in a file of its own; or, for `throw`,
  # the rank that threw left, and the others ended the job for it.
  step2=$(ls -d "$work"/checkpoints/step-*2)
  case "$1" in
    manifest) [ -f "$step2/.MANIFEST.tmp" ] || fail "rank 0 was not killed in the manifest" ;;
    throw)
      grep -q "a failure of the trainer's while a save is in flight" "$work/died.txt" ||
        fail "the rank did not throw: $(cat "$work/died.txt")"
      grep -q "left the job" "$work/died.txt" ||
        fail "the job did not end for the rank that left: $(cat "$work/died.txt")"
      [ ! -f "$step2/MANIFEST" ] || fail "step 2 was completed without the rank that threw" ;;
    *) ls "$step2"/.*-of-"$ranks".tmp >/dev/null 2>&1 || fail "no rank was killed in its file" ;;
  esac
  [ "$1" = throw ] || echo "killed in: $(cd "$step2" && ls -A | grep '\.tmp$')"
  bounded 60 "$mpiexec" -n "$ranks" "$program" resume "$work/checkpoints" >"$work/resumed.txt" 2>&1 ||
    fail "the resuming job failed: $(cat "$work/resumed.txt")"
  cat "$work/resumed.txt"
  grep -q "step 2 ignored: it has no manifest" "$work/resumed.txt" || fail "no word of step 2"
  grep -q "resumed step 1" "$work/resumed.txt" || fail "did not resume step 1"
  grep -q "state of step 1 intact on every rank" "$work/resumed.txt" || fail "state not intact"
else
  fail "mode is job or rank, not $mode"
fi
rm -rf "$work"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cohort across hosts: jobs run on tools/cluster.sh's simulated hosts (network namespaces joined
# by a bridge, links shaped to 1 Gbit/s), each bounded in time. Skipped (77) where the cluster
# cannot be made (not root, no network namespaces).
#
#   multihost.sh suites BUILD                the test suites of the collectives, allreduce_grad of
#                                            every host strategy, topology, overlap and
#                                            shared_memory at 2 hosts x 2 ranks
#   multihost.sh example PROGRAM [ARGS...]   PROGRAM at 2 x 1 and 2 x 2 (each strategy it is
#                                            given with --strategy in STRATEGIES, space-separated)
#                                            reaches the test accuracy of the same ranks on one
#                                            host (within 0.02)
#   multihost.sh checkpoint PROGRAM [ARGS...] an epoch saved across hosts resumed on one host,
#                                            and the reverse: both end with the weights of the
#                                            whole run, bit for bit (COMPARE=accuracy: with its
#                                            test accuracy, within 0.02, for a LibTorch program,
#                                            whose arithmetic depends on its threads per rank,
#                                            set from the ranks per host)
#   multihost.sh fault kill|cut|slow PROGRAM [ARGS...]
#                                            host2 killed, its link cut, or its link slowed to a
#                                            crawl mid-training (COHORT_TIMEOUT=6,
#                                            COHORT_STALL_WARNING=2): the job ends within the
#                                            bound, saying which ranks (on which host) are gone
#                                            or late; the last complete checkpoint then resumes
#                                            on one host and ends with the whole run's weights
#   multihost.sh launcher lost-host|crash|unshared PROGRAM [ARGS...]
#                                            tools/cohort-run on 3 hosts x 1 rank (MULTIHOST_HOSTS
#                                            =3): host3 lost mid-epoch, the run restarted on the 2
#                                            left ends within 0.01 of the test accuracy of a run
#                                            without a fault, and again with host3 coming back (a
#                                            grow to 3); a trainer failing at once stopped after 2
#                                            restarts; a checkpoint directory one host does not
#                                            share refused before the trainer starts
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cluster=$here/../../tools/cluster.sh
mode=${1:?usage: multihost.sh suites|example|checkpoint|fault ...}
shift
fail() { echo "multihost.sh: FAILED: $*" >&2; exit 1; }
skip() { echo "multihost.sh: skipped: $*"; exit 77; }
# The whole test ends by itself before ctest's limit (MULTIHOST_SECONDS, 360 s; the test's is
# 400), so that its trap always takes the cluster down: every job's bound is cut to what is left.
deadline=$((SECONDS + ${MULTIHOST_SECONDS:-360}))
# A job (a command or one of the functions below) that must end within $1 seconds (124: it did
# not).
bounded() {
  local limit=$1 left=$((deadline - SECONDS - 10))
  shift
  [ "$left" -gt 0 ] || fail "out of time (MULTIHOST_SECONDS) before: $*"
  [ "$limit" -gt "$left" ] && limit=$left
  timeout --kill-after=5 "$limit" bash -c '"$@"' bounded "$@"
}

[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, a bridge, tc)"
export COHORT_CLUSTER_NAME=cohort-test
ip netns add "$COHORT_CLUSTER_NAME-probe" 2>/dev/null || skip "no network namespaces here"
ip netns del "$COHORT_CLUSTER_NAME-probe"
"$cluster" down >/dev/null 2>&1 || true # what a killed test left behind
trap '"$cluster" down' EXIT
"$cluster" up "${MULTIHOST_HOSTS:-2}" --rate 1gbit

# mpirun on one host (this machine's root namespace) and across the cluster's hosts.
one_host() { local n=$1; shift; mpirun --oversubscribe --allow-run-as-root -n "$n" "$@"; }
across() {
  local k=$1 forward=()
  shift
  # (the ranks start in a clean environment, as through ssh: the sanitizers' settings too)
  for v in COHORT_TIMEOUT COHORT_STALL_WARNING TSAN_OPTIONS ASAN_OPTIONS LSAN_OPTIONS \
    UBSAN_OPTIONS OMPI_MCA_mca_base_component_disable_dlclose; do
    [ -n "${!v:-}" ] && forward+=(-x "$v")
  done
  "$cluster" run "$k" "${forward[@]}" "$@"
}
export -f one_host across
export cluster
accuracy_of() { sed -n 's/^test accuracy: \([0-9][0-9.]*\)$/\1/p' "$1"; }
weights_of() { grep "final weights" "$1" || fail "$1 printed no weights: $(tail -5 "$1")"; }
# The step of the newest complete checkpoint in DIR (cohort::checkpointer's step-<step>/MANIFEST).
newest_step() {
  ls -d "$1"/step-*/MANIFEST 2>/dev/null | sed 's|.*/step-0*\([0-9]*\)/MANIFEST|\1|' |
    sort -n | tail -n 1 || true
}
work=$(mktemp -d /tmp/cohort-multihost.XXXXXX)
trap '"$cluster" down; rm -rf "$work"' EXIT # (the ranks gone before their files)

case "$mode" in
  suites)
    build=${1:?suites BUILD}
    for suite in communicator_collectives communicator_allreduce_grad communicator_overlap \
      communicator_shared_memory communicator_any_communicator algorithm_ring; do
      echo "== $suite at 2 hosts x 2 ranks"
      bounded 300 across 2 -x COHORT_TEST_WATCHDOG=240 "$build/test/test_$suite" >"$work/$suite.txt" 2>&1 ||
        fail "$suite: $(grep -E 'error|fatal|cohort:' "$work/$suite.txt" | head -20)"
      grep -c "No errors detected" "$work/$suite.txt" | grep -qx 4 || fail "$suite: not every rank passed"
    done
    # Two real nodes, found by MPI (no simulated split).
    bounded 120 across 2 -x COHORT_EXPECT_RANKS_PER_NODE=2 "$build/test/test_communicator_topology" \
      >"$work/topology.txt" 2>&1 || fail "topology: $(grep error "$work/topology.txt" | head)"
    # A rank that stops (rank 3, on host2): the others name it and its host, from the names the
    # ranks exchanged when the communicator was made.
    status=0
    bounded 60 across 2 "$build/test/test_communicator_failure" stalled >"$work/stalled.txt" 2>&1 ||
      status=$?
    [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "the stalled job ended with $status"
    grep -Eq "cohort: timeout on rank [0-2] \\(host[12]\\): allreduce_grad .*not arrived \\(no answer\\): 3 \\(host2\\)" \
      "$work/stalled.txt" || fail "the stalled rank not named with its host: $(grep cohort: "$work/stalled.txt")"
    echo "every suite passed across 2 hosts; the topology found 2 nodes of 2 ranks; a stalled rank is named with its host"
    ;;

  example)
    program=${1:?example PROGRAM}
    shift
    for strategy in ${STRATEGIES:-default}; do
      args=("$@")
      [ "$strategy" = default ] || args+=(--strategy "$strategy")
      for k in 1 2; do
        n=$((2 * k))
        bounded 300 one_host "$n" "$program" "${args[@]}" >"$work/one.txt" 2>&1 ||
          fail "$strategy on one host at $n ranks: $(tail -5 "$work/one.txt")"
        bounded 300 across "$k" "$program" "${args[@]}" >"$work/across.txt" 2>&1 ||
          fail "$strategy across 2 x $k: $(tail -5 "$work/across.txt")"
        a=$(accuracy_of "$work/one.txt")
        b=$(accuracy_of "$work/across.txt")
        [ -n "$a" ] && [ -n "$b" ] || fail "no 'test accuracy:' line"
        same=different
        [ "$(weights_of "$work/one.txt")" = "$(weights_of "$work/across.txt")" ] && same="bit-identical"
        echo "$(basename "$program") $strategy: test accuracy $a on one host ($n ranks), $b on 2 hosts x $k ($same weights)"
        awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 + 1e-9 && b >= 0.8) }' ||
          fail "$strategy at 2 x $k: accuracy $b against $a on one host"
      done
    done
    ;;

  checkpoint)
    program=${1:?checkpoint PROGRAM}
    shift
    # 3 epochs of 50 steps; the first epoch saved at its end, then the rest resumed elsewhere.
    bounded 300 one_host 4 "$program" "$@" >"$work/whole.txt" 2>&1 || fail "the whole run failed"
    whole=$(weights_of "$work/whole.txt")
    for way in "across one_host" "one_host across"; do
      read -r first then <<<"$way"
      ckpt=$work/ckpt-$first
      k_first=4 k_then=4
      [ "$first" = across ] && k_first=2
      [ "$then" = across ] && k_then=2
      bounded 300 "$first" "$k_first" "$program" "$@" --epochs 1 --checkpoint "$ckpt" \
        --checkpoint-every 50 >"$work/first.txt" 2>&1 || fail "the first epoch ($first) failed"
      bounded 300 "$then" "$k_then" "$program" "$@" --checkpoint "$ckpt" --checkpoint-every 50 \
        >"$work/then.txt" 2>&1 || fail "the resumed run ($then) failed: $(tail -5 "$work/then.txt")"
      grep -q "resumed from step 50" "$work/then.txt" || fail "$then did not resume at step 50"
      saved="saved ${first/one_host/on one host}, resumed ${then/one_host/on one host}"
      if [ "${COMPARE:-weights}" = weights ]; then
        [ "$(weights_of "$work/then.txt")" = "$whole" ] ||
          fail "$saved: '$(weights_of "$work/then.txt")' against the whole run's '$whole'"
        echo "$saved: the whole run's weights, bit for bit"
      else
        a=$(accuracy_of "$work/whole.txt")
        b=$(accuracy_of "$work/then.txt")
        awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 + 1e-9) }' ||
          fail "$saved: test accuracy $b against the whole run's $a"
        echo "$saved: test accuracy $b, the whole run's $a"
      fi
    done
    ;;

  fault)
    fault=${1:?fault kill|cut|slow PROGRAM}
    program=${2:?fault kill|cut|slow PROGRAM}
    shift 2
    export COHORT_TIMEOUT=6 COHORT_STALL_WARNING=2
    bounded 300 one_host 4 "$program" "$@" >"$work/whole.txt" 2>&1 || fail "the whole run failed"
    whole=$(weights_of "$work/whole.txt")
    ckpt=$work/ckpt
    # In a process group of its own, to be killed whole should it outlive the bound.
    setsid bash -c 'across 2 "$@"' job "$program" "$@" --checkpoint "$ckpt" --checkpoint-every 10 \
      >"$work/job.txt" 2>&1 &
    job=$!
    # The fault once a checkpoint of step 20 or later is complete.
    newest=
    for _ in $(seq 1 2400); do
      newest=$(newest_step "$ckpt")
      [ -n "$newest" ] && [ "$newest" -ge 20 ] && break
      kill -0 "$job" 2>/dev/null || fail "the job ended before the fault: $(tail -5 "$work/job.txt")"
      sleep 0.05
    done
    [ -n "$newest" ] && [ "$newest" -ge 20 ] || fail "no checkpoint of step 20 within 2 minutes"
    [ $((deadline - SECONDS)) -gt 120 ] || fail "out of time (MULTIHOST_SECONDS) for the fault"
    # The job must end within this many seconds of the fault: about 1 s, 5-8 s and 9 s here on
    # a quiet machine (docs/multihost.md), with room for a busy one.
    case "$fault" in
      kill) limit=10 ;;
      cut) limit=20 ;;
      slow) limit=25 ;;
    esac
    case "$fault" in
      kill) "$cluster" kill host2 ;;
      cut) "$cluster" cut host2 ;;
      slow) "$cluster" rate host2 "${SLOW_RATE:-200kbit}" ;;
      *) fail "fault is kill, cut or slow, not $fault" ;;
    esac
    at=$SECONDS
    ended=
    while [ $((SECONDS - at)) -lt "$limit" ]; do
      if ! kill -0 "$job" 2>/dev/null; then ended=yes; break; fi
      sleep 0.1
    done
    took=$((SECONDS - at))
    status=0
    if [ -z "$ended" ]; then
      kill -9 -- "-$job" 2>/dev/null || true
      cat "$work/job.txt"
      fail "the job still ran $limit s after the fault ($fault)"
    fi
    wait "$job" || status=$?
    cat "$work/job.txt"
    [ "$status" -ne 0 ] || fail "the job succeeded despite the fault"
    # Who is gone or late, by rank and host: Open MPI's launcher for a host lost (it ends the
    # job before any rank waits long), cohort's lines for a link cut (the ranks across it, by the
    # hosts they reported) or too slow (the transfer every rank began).
    case "$fault" in
      # (Open MPI's words vary with the moment: "lost communication with a remote daemon ... on
      # node host2", "Peer host: host2", or "unable to reliably start one or more daemons",
      # which names no host)
      kill) expect="lost communication with a remote daemon|Peer host:|daemon" ;;
      # (cut at a rendezvous, the ranks across are named; inside a transfer, the transfer)
      cut) expect="cohort: (stall|timeout) on rank [01] \\(host1\\): [a-z_]+ .*(not arrived \\(no answer\\): 2 \\(host2\\), 3 \\(host2\\)|every rank had arrived at it)" ;;
      slow) expect="cohort: (stall|timeout) on rank [0-3] \\(host[12]\\): allreduce_grad \\(#[0-9]+, [0-9]+ bytes" ;;
    esac
    grep -Ezq "$expect" "$work/job.txt" || fail "no message saying '$expect'"
    echo "host2 ${fault}: the job ended $took s after the fault (status $status)"
    grep -E "cohort: (stall|timeout)|lost|host2" "$work/job.txt" | head -6 | sed 's/^/  /' || true
    # Nothing corrupted: the newest complete checkpoint resumes on one host and ends as the whole
    # run did.
    "$cluster" down >/dev/null
    unset COHORT_TIMEOUT COHORT_STALL_WARNING
    bounded 300 one_host 4 "$program" "$@" --checkpoint "$ckpt" --checkpoint-every 10 \
      >"$work/resumed.txt" 2>&1 || fail "the resumed run failed: $(tail -5 "$work/resumed.txt")"
    grep "resumed from step" "$work/resumed.txt" || fail "did not resume"
    [ "$(weights_of "$work/resumed.txt")" = "$whole" ] ||
      fail "resumed after the fault: '$(weights_of "$work/resumed.txt")' against '$whole'"
    echo "the last complete checkpoint resumed on one host: the whole run's weights, bit for bit"
    ;;

  launcher)
    scenario=${1:?launcher lost-host|crash|unshared PROGRAM [ARGS...]}
    program=${2:?launcher SCENARIO PROGRAM [ARGS...]}
    shift 2
    launcher=$here/../../tools/cohort-run
    [ "${MULTIHOST_HOSTS:-2}" -eq 3 ] || fail "the launcher's tests need MULTIHOST_HOSTS=3"
    printf 'host%s slots=1\n' 1 2 3 >"$work/hosts"
    # A host answers cohort-run's probe when mpirun starts a process on it; one whose link is
    # cut does not, within --probe-timeout.
    cohort_run=("$launcher" --hosts "$work/hosts" --mpirun "$cluster mpirun"
      --probe-timeout "${PROBE_TIMEOUT:-5}")
    now() { date +%s.%N; }
    since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
    # Waits (bounded) until FILE has COUNT lines (default 1) matching PATTERN; prints the time
    # they were seen.
    wait_for_line() {
      local file=$1 pattern=$2 job=$3 limit=$4 count=${5:-1}
      for _ in $(seq 1 $((limit * 20))); do
        if [ "$(grep -Ec "$pattern" "$file" || true)" -ge "$count" ]; then now; return 0; fi
        if ! kill -0 "$job" 2>/dev/null; then
          [ "$(grep -Ec "$pattern" "$file" || true)" -ge "$count" ] && { now; return 0; }
          break
        fi
        sleep 0.05
      done
      cat "$file" >&2
      fail "no line '$pattern' (x$count) within $limit s"
    }
    # A launcher still running when the test fails is told to stop (it ends its job).
    job=
    trap 'if [ -n "$job" ]; then kill -TERM "$job" 2>/dev/null || true; fi; "$cluster" down; rm -rf "$work"' EXIT
    case "$scenario" in
      lost-host)
        # The run without a fault, through cohort-run too, saving at the same steps.
        t=$(now)
        bounded 300 "${cohort_run[@]}" --checkpoint-dir "$work/ckpt-whole" -- "$program" "$@" \
          --checkpoint "$work/ckpt-whole" --checkpoint-every 10 >"$work/whole.txt" 2>&1 ||
          fail "the run without a fault failed: $(tail -5 "$work/whole.txt")"
        whole_s=$(since "$t" "$(now)")
        whole=$(accuracy_of "$work/whole.txt")
        [ -n "$whole" ] || fail "no test accuracy in the run without a fault"
        echo "without a fault: test accuracy $whole in $whole_s s (3 hosts x 1 rank)"
        for way in shrink grow; do
          "$cluster" mend host3 # (lost in the run before)
          ckpt=$work/ckpt-$way
          out=$work/$way.txt
          grow=()
          [ "$way" = grow ] && grow=(--grow-check 1)
          t=$(now)
          setsid "${cohort_run[@]}" "${grow[@]}" --checkpoint-dir "$ckpt" -- "$program" "$@" \
            --checkpoint "$ckpt" --checkpoint-every 10 >"$out" 2>&1 &
          job=$!
          # host3 lost mid-epoch: its processes killed and its link cut, right after the
          # checkpoint of step FAULT_STEP (epochs of 50 steps).
          at_step=${FAULT_STEP:-270}
          for _ in $(seq 1 2400); do
            step=$(newest_step "$ckpt")
            [ -n "$step" ] && [ "$step" -ge "$at_step" ] && break
            kill -0 "$job" 2>/dev/null || fail "the job ended before the fault: $(tail -5 "$out")"
            sleep 0.05
          done
          [ -n "$step" ] && [ "$step" -ge "$at_step" ] || fail "no checkpoint of step $at_step within 2 minutes"
          fault=$(now)
          "$cluster" kill host3
          "$cluster" cut host3
          ended=$(wait_for_line "$out" "^cohort-run: attempt 1 ended" "$job" 60)
          restarted=$(wait_for_line "$out" "^cohort-run: attempt 2 at" "$job" 60)
          resumed=$(wait_for_line "$out" "^resumed from step" "$job" 60)
          grown= grow_times=(- -)
          if [ "$way" = grow ]; then
            "$cluster" mend host3
            grow_ended=$(wait_for_line "$out" "^cohort-run: attempt 2 ended .*: ended by cohort-run to grow" "$job" 120)
            grow_started=$(wait_for_line "$out" "^cohort-run: attempt 3 at .*3 rank\\(s\\) on host1 host2 host3, from step [0-9]+ \\(grow\\)" \
              "$job" 60)
            grow_resumed=$(wait_for_line "$out" "^resumed from step" "$job" 60 2)
            grow_times=("$(since "$grow_ended" "$grow_started")" "$(since "$grow_started" "$grow_resumed")")
            grown="; the grow: restarted $(since "$grow_ended" "$grow_started") s after the job was ended at a checkpoint, resumed $(since "$grow_started" "$grow_resumed") s after that"
          fi
          status=0
          bounded 300 bash -c 'while kill -0 "$0" 2>/dev/null; do sleep 0.2; done' "$job" ||
            { kill -9 -- "-$job" 2>/dev/null; fail "$way: cohort-run still ran after 300 s"; }
          wait "$job" || status=$?
          took=$(since "$t" "$(now)")
          [ "$status" -eq 0 ] || { cat "$out"; fail "$way: cohort-run ended with $status"; }
          grep -Eq "^cohort-run: attempt 2 at .*: 2 rank\\(s\\) on host1 host2 \\(not answering: host3\\), from step [0-9]+ \\(restart 1 of at most 3\\)" \
            "$out" || { cat "$out"; fail "$way: no restart on host1 host2"; }
          b=$(accuracy_of "$out" | tail -n 1)
          awk -v a="$whole" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01 + 1e-9) }' ||
            { cat "$out"; fail "$way: test accuracy $b against $whole without a fault"; }
          grep "^cohort-run: " "$out" | sed 's/^/  /'
          echo "$way: test accuracy $b ($whole without a fault); $took s in all, $(since "$whole_s" "$took") s lost: job ended $(since "$fault" "$ended") s after the fault, restarted $(since "$ended" "$restarted") s later (probing the hosts), resumed $(since "$restarted" "$resumed") s after that$grown"
          # (for bench/launcher.sh)
          printf 'launcher-times\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$way" \
            "$(since "$fault" "$ended")" "$(since "$ended" "$restarted")" \
            "$(since "$restarted" "$resumed")" "$took" "$whole_s" "$b" "$whole" "${grow_times[@]}"
        done
        ;;
      crash)
        # A trainer that fails at once on every start (here a global batch that 3 ranks cannot
        # share): stopped after 2 restarts, the failure named.
        status=0
        bounded 120 "${cohort_run[@]}" --max-restarts 10 -- "$program" "$@" >"$work/crash.txt" 2>&1 ||
          status=$?
        cat "$work/crash.txt"
        [ "$status" -eq 3 ] || fail "cohort-run ended with $status, not 3"
        grep -q "^cohort-run: error: the trainer failed the same way at once after each of the last 2 restarts" \
          "$work/crash.txt" || fail "the repeated failure not named"
        [ "$(grep -c '^cohort-run: attempt [0-9]* at' "$work/crash.txt")" -eq 3 ] ||
          fail "not 3 attempts"
        echo "a trainer failing at once: stopped after 2 restarts"
        ;;
      unshared)
        # A directory that host2 sees as another one: `ip netns exec` (the cluster's agent)
        # mounts /etc/netns/<namespace>/X over /etc/X.
        dir=/etc/cohort-run-test-checkpoints
        mkdir -p "$dir" "/etc/netns/$COHORT_CLUSTER_NAME-host2/$(basename "$dir")"
        trap '"$cluster" down; rm -rf "$work" "$dir"' EXIT
        status=0
        bounded 120 "${cohort_run[@]}" --checkpoint-dir "$dir" -- "$program" "$@" --checkpoint "$dir" \
          >"$work/unshared.txt" 2>&1 || status=$?
        cat "$work/unshared.txt"
        [ "$status" -eq 3 ] || fail "cohort-run ended with $status, not 3"
        grep -q "^cohort-run: error: the checkpoint directory $dir is not shared: host2 cannot see" \
          "$work/unshared.txt" || fail "host2 not named"
        ! grep -q "attempt 1 at" "$work/unshared.txt" || fail "the trainer was started"
        echo "a checkpoint directory host2 does not share: refused, host2 named"
        ;;
      *) fail "launcher: unknown scenario '$scenario'" ;;
    esac
    ;;

  *) fail "unknown mode '$mode'" ;;
esac

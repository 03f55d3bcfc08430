#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real job traced through COHORT_TRACE (examples/mnist_mlp, one short epoch), its ranks' files
# joined by tools/merge_traces.py: the merged trace holds every rank's steps, as many on each; a
# file cut in the middle of a line (a killed rank's) is still read up to its last whole event.
#
#   trace_merge.sh MPIEXEC RANKS EXAMPLE MERGE_SCRIPT WORK
set -euo pipefail
mpiexec=$1 ranks=$2 example=$3 merge=$4 work=$5
rm -rf "$work"
COHORT_TRACE="$work/trace" timeout --kill-after=5 120 "$mpiexec" -n "$ranks" \
  "$example" --epochs 1 --train-size 1200 --test-size 120 --global-batch 60
python3 "$merge" "$work/trace" -o "$work/merged.json"
python3 - "$work/merged.json" "$ranks" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
ranks = int(sys.argv[2])
spans = [e for e in events if e.get("ph") == "X"]
assert {e["pid"] for e in spans} == set(range(ranks)), "ranks in the trace"
steps = [sum(1 for e in spans if e["pid"] == r and e["name"] == "allreduce_grad")
         for r in range(ranks)]
assert steps[0] >= 20 and len(set(steps)) == 1, f"steps per rank: {steps}"
for name in ("reduce", "agreement"):
    assert any(e["name"] == name for e in spans), f"no {name} span"
for e in spans:
    assert e["dur"] >= 0 and e["args"]["strategy"], e
print(f"merged trace: {len(spans)} spans, {steps[0]} steps on each of {ranks} ranks")
PY
# A rank's file cut short, as a killed job leaves it.
mkdir -p "$work/cut"
file="$work/trace/cohort-trace-rank0.json"
head -c $(( $(stat -c %s "$file") * 2 / 3 )) "$file" > "$work/cut/cohort-trace-rank0.json"
python3 "$merge" "$work/cut" -o "$work/cut.json" > "$work/cut.txt"
python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['traceEvents']; assert len(e) > 10, len(e)" \
  "$work/cut.json"
rm -rf "$work"

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Joins the per-rank traces cohort writes (COHORT_TRACE=dir: cohort-trace-rank<r>.json, and
cohort-trace-rank<r>.comm<k>.json for more communicators traced in a process) into one Chrome trace that chrome://tracing and https://ui.perfetto.dev open with every rank as a process.

    tools/merge_traces.py DIR [-o merged.json]

A rank's file cut short by a killed job (no closing bracket, a last line half written) is read
up to its last whole event. Every rank's time 0 is the end of the agreement that made its
communicator, so the ranks of one machine line up as they are; a summary per rank and span name
(count, total and mean milliseconds) is printed.
"""
import argparse
import collections
import json
import pathlib
import re
import sys


def read_events(path):
    """The events of one rank's file, whole or cut short."""
    text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    events = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if not line.startswith("{"):
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the line a killed rank was writing
    return events


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("-o", "--output", type=pathlib.Path)
    args = parser.parse_args()
    files = sorted(args.directory.glob("cohort-trace-rank*.json"),
                   key=lambda p: (int(re.search(r"rank(\d+)", p.name).group(1)), p.name))
    if not files:
        sys.exit(f"merge_traces: no cohort-trace-rank*.json in {args.directory}")
    merged = []
    totals = collections.defaultdict(lambda: [0, 0.0])
    for path in files:
        for event in read_events(path):
            merged.append(event)
            if event.get("ph") == "X":
                entry = totals[(event["pid"], event["tid"], event["name"])]
                entry[0] += 1
                entry[1] += event["dur"] / 1000.0
    output = args.output or args.directory / "cohort-trace.json"
    output.write_text(json.dumps({"traceEvents": merged, "displayTimeUnit": "ms"}))
    print(f"{len(merged)} events of {len(files)} ranks -> {output}")
    print(f"{'rank':>4} {'thread':>9} {'span':<28} {'count':>7} {'total ms':>10} {'mean ms':>9}")
    for (pid, tid, name), (count, total) in sorted(totals.items()):
        # tid 2k: the trainer, 2k + 1: cohort's thread, of the k-th communicator traced.
        thread = ("trainer" if tid % 2 == 0 else "cohort") + (f"/{tid // 2}" if tid >= 2 else "")
        print(f"{pid:>4} {thread:>9} {name:<28} {count:>7} {total:>10.3f} {total / count:>9.4f}")


if __name__ == "__main__":
    main()

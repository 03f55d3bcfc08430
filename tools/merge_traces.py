#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Joins the per-rank traces cohort writes (COHORT_TRACE=dir: cohort-trace-rank<r>.json, and
cohort-trace-rank<r>.comm<k>.json for more communicators traced in a process) into one Chrome trace that chrome://tracing and https://ui.perfetto.dev open with every rank as a process.

    tools/merge_traces.py DIR [-o merged.json]

A rank's file cut short by a killed job (no closing bracket, a last line half written) is read
up to its last whole event. Files are read and the merged one written an event at a time, so
traces of any size merge in little memory. Every rank's time 0 is the end of the agreement that made its
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
    """The events of one rank's file, whole or cut short, one at a time: cohort writes one event
    per line, so that a rank's file of any size is never held in memory whole."""
    with path.open() as lines:
        for line in lines:
            line = line.strip().rstrip(",")
            if not line.startswith("{"):
                continue  # the opening and closing brackets
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                return  # the line a killed rank was writing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=pathlib.Path)
    parser.add_argument("-o", "--output", type=pathlib.Path)
    args = parser.parse_args()
    files = sorted(args.directory.glob("cohort-trace-rank*.json"),
                   key=lambda p: (int(re.search(r"rank(\d+)", p.name).group(1)), p.name))
    if not files:
        sys.exit(f"merge_traces: no cohort-trace-rank*.json in {args.directory}")
    totals = collections.defaultdict(lambda: [0, 0.0])
    output = args.output or args.directory / "cohort-trace.json"
    count = 0
    # Written as read, an event at a time: the merged file of many large ranks' traces never
    # sits in memory.
    with output.open("w") as out:
        out.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        for path in files:
            for event in read_events(path):
                out.write((",\n" if count else "") + json.dumps(event))
                count += 1
                if event.get("ph") == "X":
                    entry = totals[(event["pid"], event["tid"], event["name"])]
                    entry[0] += 1
                    entry[1] += event["dur"] / 1000.0
        out.write("\n]}\n")
    print(f"{count} events of {len(files)} ranks -> {output}")
    print(f"{'rank':>4} {'thread':>9} {'span':<28} {'count':>7} {'total ms':>10} {'mean ms':>9}")
    for (pid, tid, name), (count, total) in sorted(totals.items()):
        # tid 2k: the trainer, 2k + 1: cohort's thread, of the k-th communicator traced.
        thread = ("trainer" if tid % 2 == 0 else "cohort") + (f"/{tid // 2}" if tid >= 2 else "")
        print(f"{pid:>4} {thread:>9} {name:<28} {count:>7} {total:>10.3f} {total / count:>9.4f}")


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""Reads the tables the benchmarks under bench/ print (shared by plot.py and cost_model.py)."""

import re
from pathlib import Path


def _rows(path):
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            yield line


def _matches(path, pattern, kind):
    """The match of `pattern` on every row of the table; a row it does not match is an error
    naming the file."""
    for line in _rows(path):
        match = pattern.match(line)
        if not match:
            raise ValueError(f"{path}: not a bench/{kind} row: {line!r}")
        yield match


def header_value(path, pattern):
    """The first match of `pattern` (one group) in the table's comment lines."""
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            match = re.search(pattern, line)
            if match:
                return match.group(1)
    raise ValueError(f"{path}: no header line matches {pattern!r}")


def ranks(path):
    # "# ranks: 4 on 1 node(s)" (allreduce) or "# 4 ranks; ..." (grad_sync, overlap)
    return int(header_value(path, r"(?:ranks: |^# )(\d+)(?: on| ranks?\b)"))


def allreduce(path):
    """bench/allreduce: one dict per row (bytes, tensors, method, time_us, busbw, vs_raw)."""
    rows = []
    for line in _rows(path):
        fields = line.split()
        if len(fields) != 8:
            raise ValueError(f"{path}: not a bench/allreduce row: {line!r}")
        rows.append({
            "bytes": int(fields[0]),
            "tensors": int(fields[2]),
            "method": fields[3],
            "time_us": float(fields[4]),
            "busbw": float(fields[6]),
            "vs_raw": float(fields[7]),
        })
    return rows


# (older tables have no "vs tensor" column)
_GRAD_SYNC = re.compile(r"^(.+?)\s+(\d+)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+))?$")


def grad_sync(path):
    """bench/grad_sync: one dict per row (method, grouping, collectives, time_ms)."""
    # The method column is as wide as the header's "method" up to "grouping" (a method's name
    # can fill it, so spaces alone do not separate the two).
    split = header_value(path, r"^(# method\s+)grouping")
    return [{
        "method": match.group(1)[:len(split)].strip(),
        "grouping": match.group(1)[len(split):].strip(),
        "collectives": int(match.group(2)),
        "time_ms": float(match.group(3)),
    } for match in _matches(path, _GRAD_SYNC, "grad_sync")]


_OVERLAP = re.compile(r"^\s*(\d+)ms\s+(.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


def overlap(path):
    """bench/overlap: one dict per row (compute_ms, method, time_ms)."""
    return [{
        "compute_ms": int(match.group(1)),
        "method": match.group(2),
        "time_ms": float(match.group(3)),
    } for match in _matches(path, _OVERLAP, "overlap")]

# SPDX-License-Identifier: Apache-2.0
"""The scripts that turn bench/'s tables into figures and check the cost model.

  python3 scripts_test.py BENCH_DIR WORK_DIR     (exit 77: no numpy or matplotlib here)

- the fit recovers the parameters of tables made from known ones (every strategy's terms);
- the parsers read the committed tables (a grad_sync method that fills its column) and refuse a
  malformed row by the file's name;
- plot.py draws its three figures from the committed tables and refuses a table of other ranks.
"""

import shutil
import subprocess
import sys
from pathlib import Path

try:
    import matplotlib  # noqa: F401
    import numpy as np
except ImportError as missing:
    print(f"skipped: {missing}")
    sys.exit(77)

bench, work = Path(sys.argv[1]), Path(sys.argv[2])
sys.dont_write_bytecode = True  # a test leaves the source tree as it found it
sys.path.insert(0, str(bench))
import cost_model  # noqa: E402
import tables  # noqa: E402

shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAILED: {what}")


HEADER = """# cohort all-reduce benchmark (synthetic)
# ranks: {n} on 1 node(s); float32, sum, in place
#       bytes    elements  tensors          method     time(us)  algbw(GB/s)  busbw(GB/s)  vs raw
"""
METHODS = ["raw", "tensor", "tensor/nocheck", "naive", "naive/nocheck", "flat", "flat/nocheck",
           "ring", "hierarchical", "two_dimensional"]

# 1. Tables computed from known parameters: the fit must find them again.
llc = 32 << 20
for n, truth in ((2, [0.8e-6, 2.4e-6, 0.09e-9, 0.15e-9, 0.03e-9]),
                 (4, [2.4e-6, 4.0e-6, 0.2e-9, 0.27e-9, 0.075e-9])):
    truth = np.array(truth)
    for kind, tensor_bytes, largest in (("allreduce", 1 << 20, 256 << 20),
                                        ("allreduce16k", 16 << 10, 64 << 20)):
        lines = [HEADER.format(n=n)]
        size = 4096
        while size <= largest:
            tensors = max(1, size // tensor_bytes)
            for method in METHODS:
                seconds = cost_model.row_terms(method, n, size, tensors, llc) @ truth
                lines.append(f"{size:>13} {size // 4:>11} {tensors:>8} {method:>15} "
                             f"{seconds * 1e6:>12.4f} {1.0:>12.3f} {1.0:>12.3f} {1.0:>7.2f}\n")
            size *= 2
        (work / f"plot-{kind}-np{n}.txt").write_text("".join(lines))
    rows = []
    for kind in ("allreduce", "allreduce16k"):
        rows += tables.allreduce(work / f"plot-{kind}-np{n}.txt")
    found = cost_model.fit(rows, n, llc)
    for name, want, got in zip(cost_model.PARAMETERS, truth, found):
        check(abs(got - want) <= 0.01 * want, f"{n} ranks: {name} fitted {got:.4g}, made with {want:.4g}")

# 2. The committed tables parse; a malformed row names its file.
for n in (2, 4):
    methods = [r["method"] for r in tables.grad_sync(bench / "results" / f"plot-grad_sync-np{n}.txt")]
    check("flat, 256 KiB seg." in methods, f"grad_sync np{n}: methods read as {methods}")
    check(len(tables.overlap(bench / "results" / f"plot-overlap-np{n}.txt")) > 0, f"overlap np{n} empty")
    check(tables.ranks(bench / "results" / f"plot-allreduce-np{n}.txt") == n, f"allreduce np{n} ranks")
bad = work / "bad.txt"
bad.write_text(HEADER.format(n=2) + "   4096  1024  1  raw  1.0\n")
try:
    tables.allreduce(bad)
    check(False, "a row of five fields was read")
except ValueError as error:
    check("bad.txt" in str(error), f"the error does not name the file: {error}")

# 3. The figures, from the committed tables; a table of other ranks is refused.
out = work / "figures"
run = subprocess.run([sys.executable, str(bench / "plot.py"), "--out", str(out)],
                     capture_output=True, text=True)
check(run.returncode == 0, f"plot.py failed: {run.stderr}")
for name in ("bandwidth.png", "vs_raw.png", "step.png"):
    path = out / name
    check(path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10000,
          f"{name} is not a drawn PNG")
mixed = work / "mixed"
mixed.mkdir()
for kind in ("allreduce", "grad_sync", "overlap"):
    shutil.copy(bench / "results" / f"plot-{kind}-np4.txt", mixed / f"plot-{kind}-np2.txt")
run = subprocess.run([sys.executable, str(bench / "plot.py"), "--results", str(mixed), "--out",
                      str(work / "mixed-out"), "--ranks", "2"], capture_output=True, text=True)
check(run.returncode != 0 and "a table of 4 ranks, not 2" in run.stderr,
      f"plot.py drew a 4-rank table as 2 ranks: {run.returncode} {run.stderr}")

sys.exit(1 if failures else 0)

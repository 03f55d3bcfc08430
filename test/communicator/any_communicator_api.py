#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""basic_any_communicator forwards the whole front door.

A strategy chosen at run time (basic_any_communicator) forwards each public member of the front
door by hand: basic_communicator, its bases grad_sync_base and communicator_base, and the public
members of the host strategies it holds (any_communicator's). A member added there and not here
is a call that compiles with `flat` and not with `any_communicator`. This test reads both from
clang's syntax tree of <cohort/communicator/any_communicator.hpp> and fails naming every public
member function (by name and parameter count, so that a new overload or parameter counts too)
that the front door has and basic_any_communicator lacks.

  any_communicator_api.py CLANG [COMPILER FLAGS...]
"""

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# The front door, and the strategies of cohort::any_communicator (their own public members).
FRONT_DOOR = ["basic_communicator", "grad_sync_base", "communicator_base"]
STRATEGIES = ["naive", "flat", "hierarchical", "two_dimensional", "dummy"]
RUN_TIME = "basic_any_communicator"

# Members the front door has that a run-time strategy leaves out on purpose, with the reason.
EXEMPT = {}


def syntax_tree(clang, flags):
    """The declarations of namespace cohort, as clang's JSON dump (one object per declaration of
    the namespace: it is opened in every header). With COHORT_SEPARATE_COMPILATION the engine's
    bodies are left out: the public API is the same, the dump a third of the size."""
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "api.cpp"
        source.write_text("#include <cohort/communicator/any_communicator.hpp>\n")
        run = subprocess.run(
            [clang, "-std=c++20", "-fsyntax-only", "-DCOHORT_SEPARATE_COMPILATION", *flags,
             "-Xclang", "-ast-dump=json", "-Xclang", "-ast-dump-filter", "-Xclang", "cohort::",
             str(source)],
            capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{clang} could not read the front door (exit {run.returncode}):\n{run.stderr}")
    out = run.stdout
    decoder = json.JSONDecoder()
    at, tops = 0, []
    while True:
        while at < len(out) and out[at].isspace():
            at += 1
        if at >= len(out):
            return tops
        top, at = decoder.raw_decode(out, at)
        tops.append(top)


def class_definitions(tops):
    """Every class defined in the dump, by name (a class template's pattern included)."""
    found = {}
    stack = list(tops)
    while stack:
        node = stack.pop()
        if node.get("kind") == "CXXRecordDecl" and node.get("completeDefinition") and "inner" in node:
            found.setdefault(node.get("name"), node)
        stack.extend(child for child in node.get("inner", []) if isinstance(child, dict))
    return found


def public_members(record):
    """(name, parameter count) of each public member function, templates included; constructors
    and operators are not forwarded members."""
    access = "public" if record.get("tagUsed") == "struct" else "private"
    members = set()
    for decl in record["inner"]:
        if decl["kind"] == "AccessSpecDecl":
            access = decl["access"]
            continue
        if access != "public":
            continue
        method = decl
        if decl["kind"] == "FunctionTemplateDecl":
            method = next((d for d in decl["inner"] if d["kind"] == "CXXMethodDecl"), None)
        if method is None or method["kind"] != "CXXMethodDecl" or method["name"].startswith("operator"):
            continue
        parameters = sum(1 for d in method.get("inner", []) if d["kind"] == "ParmVarDecl")
        members.add((method["name"], parameters))
    return members


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    if shutil.which(sys.argv[1]) is None:
        print(f"no clang++ ({sys.argv[1]}): skipped")
        return 77
    classes = class_definitions(syntax_tree(sys.argv[1], sys.argv[2:]))
    missing_classes = [c for c in FRONT_DOOR + STRATEGIES + [RUN_TIME] if c not in classes]
    if missing_classes:
        print("not found in the syntax tree: " + ", ".join(missing_classes))
        return 1
    owner = {}
    for name in FRONT_DOOR + STRATEGIES:
        for member in public_members(classes[name]):
            owner.setdefault(member, name)
    # A dump that read nothing would pass: the front door's best-known members must be there.
    for expected in [("allreduce_grad", 3), ("allreduce", 2), ("rank", 0)]:
        if expected not in owner:
            print(f"the front door's {expected[0]}({expected[1]} parameters) was not read: "
                  "has clang's JSON dump changed?")
            return 1
    forwarded = public_members(classes[RUN_TIME])
    missing = sorted(m for m in owner if m not in forwarded and m[0] not in EXEMPT)
    print(f"{len(owner)} public member functions in the front door and {', '.join(STRATEGIES)}; "
          f"{RUN_TIME} has {len(forwarded)}")
    for name, parameters in missing:
        print(f"{RUN_TIME} lacks {owner[(name, parameters)]}::{name} with {parameters} "
              "parameters: forward it (communicator/any_communicator.hpp), or list it in EXEMPT "
              "here with the reason")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""basic_any_communicator forwards the whole front door.

A strategy chosen at run time (basic_any_communicator) forwards each public member of the front
door by hand: basic_communicator and its public bases (grad_sync_base, communicator_base, read
from the syntax tree), and the public members of the host strategies that any_communicator holds
(read from its alias). A member added there and not here is a call that compiles with `flat` and
not with `any_communicator`. This test reads both from clang's syntax tree of
<cohort/communicator/any_communicator.hpp> and fails naming every public member function that
the front door has and basic_any_communicator lacks, compared by name, parameter types (the
function's template parameters by position), how many parameters have a default and whether it
is const, each overload counted. Not read: the GPU strategies (any_gpu_communicator), which
need nvcc.

  any_communicator_api.py CLANG [COMPILER FLAGS...]
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

# Where the front door starts (its bases are read from the syntax tree), and the type whose
# strategies' own public members count too.
FRONT_DOOR = "basic_communicator"
RUN_TIME = "basic_any_communicator"
HOST_ALIAS = "any_communicator"

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


def declarations(tops):
    """Every class defined in the dump, by name (a class template's pattern included), and every
    type alias."""
    classes, aliases = {}, {}
    stack = list(tops)
    while stack:
        node = stack.pop()
        kind = node.get("kind")
        if kind == "CXXRecordDecl" and node.get("completeDefinition") and "inner" in node:
            classes.setdefault(node.get("name"), node)
        elif kind == "TypeAliasDecl":
            aliases.setdefault(node.get("name"), node)
        stack.extend(child for child in node.get("inner", []) if isinstance(child, dict))
    return classes, aliases


def unqualified(type_name):
    """`cohort::basic_communicator<cohort::flat>` -> `basic_communicator`."""
    return re.sub(r"^(\w+::)*", "", type_name.split("<", 1)[0].strip())


def template_arguments(type_name):
    """`a<b, c<d, e>, f>` -> [`b`, `c<d, e>`, `f`]: the top-level arguments, split by depth."""
    arguments, depth, current = [], 0, ""
    for char in type_name[type_name.index("<") + 1:type_name.rindex(">")]:
        depth += (char == "<") - (char == ">")
        if char == "," and depth == 0:
            arguments.append(current.strip())
            current = ""
        else:
            current += char
    return arguments + [current.strip()]


def with_bases(classes, name):
    """`name` and its public bases, transitively, in the order met."""
    found, todo = [], [name]
    while todo:
        current = todo.pop(0)
        if current in found or current not in classes:
            continue
        found.append(current)
        for base in classes[current].get("bases", []):
            if base.get("access") == "public":
                todo.append(unqualified(base["type"]["qualType"]))
    return found


def signature(method, template):
    """(name, parameter types, how many have a default, const or not): the parameter types
    without namespaces, and the function's own template parameters by position, so that
    `Params&` in one class and `P&` in another compare by what they are, not how they are
    spelled."""
    names = [d.get("name") for d in (template or {}).get("inner", [])
             if d["kind"].endswith("TemplateParmDecl")]
    types, defaults = [], 0
    for parameter in (d for d in method.get("inner", []) if d["kind"] == "ParmVarDecl"):
        text = parameter["type"]["qualType"]
        for position, name in enumerate(names):
            if name is None:
                continue
            text = re.sub(rf"\b{re.escape(name)}\b", f"<T{position}>", text)
        types.append(" ".join(re.sub(r"\b\w+::", "", text).split()))
        defaults += "init" in parameter
    const = re.search(r"\)\s*const\b[^)]*$", method["type"]["qualType"]) is not None
    return method["name"], tuple(types), defaults, const


def public_members(record):
    """The signatures of the public member functions, templates included, each as often as it is
    declared; constructors and operators are not forwarded members."""
    access = "public" if record.get("tagUsed") == "struct" else "private"
    members = Counter()
    for decl in record["inner"]:
        if decl["kind"] == "AccessSpecDecl":
            access = decl["access"]
            continue
        if access != "public":
            continue
        method, template = decl, None
        if decl["kind"] == "FunctionTemplateDecl":
            method = next((d for d in decl["inner"] if d["kind"] == "CXXMethodDecl"), None)
            template = decl
        if (method is None or method["kind"] != "CXXMethodDecl"
                or re.match(r"operator\b", method["name"])):
            continue
        members[signature(method, template)] += 1
    return members


def describe(member):
    name, types, defaults, const = member
    return (f"{name}({', '.join(types)}){' const' if const else ''} with {defaults} default "
            "argument(s)")


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    if shutil.which(sys.argv[1]) is None:
        print(f"no clang++ ({sys.argv[1]}): skipped")
        return 77
    classes, aliases = declarations(syntax_tree(sys.argv[1], sys.argv[2:]))
    if HOST_ALIAS not in aliases or RUN_TIME not in classes:
        print(f"{HOST_ALIAS} or {RUN_TIME} not found in the syntax tree")
        return 1
    alias = aliases[HOST_ALIAS]["type"]
    strategies = [unqualified(s)
                  for s in template_arguments(alias.get("desugaredQualType", alias["qualType"]))]
    front_door = with_bases(classes, FRONT_DOOR)
    missing_classes = [c for c in strategies + [FRONT_DOOR] if c not in classes]
    if missing_classes:
        print("not found in the syntax tree: " + ", ".join(missing_classes))
        return 1
    # A member and the one of the same signature it hides in a base count once (the larger
    # count); overloads of one class count each.
    wanted, owner = Counter(), {}
    for name in front_door + strategies:
        members = public_members(classes[name])
        wanted |= members
        for member in members:
            owner.setdefault(member, name)
    # A dump that read nothing would pass: the front door's best-known members must be there.
    if not any(m[0] == "allreduce_grad" for m in wanted) or "communicator_base" not in front_door:
        print("the front door was not read whole (allreduce_grad, communicator_base): has clang's "
              "JSON dump changed?")
        return 1
    forwarded = public_members(classes[RUN_TIME])
    missing = sorted(m for m, n in wanted.items() if forwarded[m] < n and m[0] not in EXEMPT)
    print(f"{sum(wanted.values())} public member functions in {', '.join(front_door)} and "
          f"{', '.join(strategies)}; {RUN_TIME} has {sum(forwarded.values())}")
    for member in missing:
        print(f"{RUN_TIME} lacks {owner[member]}::{describe(member)}: forward it "
              "(communicator/any_communicator.hpp), or list it in EXEMPT here with the reason")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

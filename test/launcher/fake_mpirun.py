#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An mpirun for cohort-run's tests: hosts that exist only as names in a state directory.

  fake_mpirun.py STATE [--host H:N,...] [-np N] [-x VAR]... COMMAND...

STATE/down lists the hosts that are gone (a probe of one fails as Open MPI's would, or hangs if
STATE/hang exists); STATE/unshared the hosts that do not see the launcher's files. A job runs
COMMAND once, here, for all its ranks, with FAKE_HOSTS and FAKE_RANKS set, and every call is
logged to STATE/calls (one line: the hosts, the ranks, the command).
"""
import os
import sys
import time

state = sys.argv[1]
args = sys.argv[2:]
hosts, ranks, command = [], None, []
while args:
    a = args.pop(0)
    if a == "--host":
        hosts = [h.split(":") for h in args.pop(0).split(",")]
    elif a == "-np":
        ranks = int(args.pop(0))
    elif a == "-x":
        args.pop(0)
    else:
        command = [a] + args
        break


def listed(name):
    try:
        with open(os.path.join(state, name)) as f:
            return f.read().split()
    except FileNotFoundError:
        return []


names = [h[0] for h in hosts]
with open(os.path.join(state, "calls"), "a") as f:
    f.write(f"{','.join(':'.join(h) for h in hosts)} {ranks} {' '.join(command)}\n")
probe = command[:2] == ["sh", "-c"] and "cohort-run-probe" in command[2]
if probe:
    host = names[0]
    if host in listed("down"):
        if os.path.exists(os.path.join(state, "hang")):
            time.sleep(3600)
        print(f"ORTE was unable to reliably start one or more daemons ({host} is down)")
        sys.exit(1)
    print("cohort-run-probe")
    if "shared" in command[2]:
        print("not-shared" if host in listed("unshared") else "shared")
    sys.exit(0)
lost = [h for h in names if h in listed("down")]
if lost:
    print(f"ORTE was unable to reliably start one or more daemons: {lost[0]}")
    sys.exit(1)
env = dict(os.environ, FAKE_HOSTS=",".join(names), FAKE_RANKS=str(ranks), FAKE_STATE=state)
os.execvpe(command[0], command, env)

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A trainer for cohort-run's tests, under fake_mpirun.py: `trainer.py SCENARIO CHECKPOINTS`.
It records every start (STATE/starts: the restart count, the hosts, the ranks) and writes
checkpoints as cohort::checkpointer does (CHECKPOINTS/step-<step>/MANIFEST)."""
import os
import signal
import subprocess
import sys
import time

scenario, checkpoints = sys.argv[1], sys.argv[2]
state = os.environ["FAKE_STATE"]
hosts = os.environ["FAKE_HOSTS"].split(",")
restart = int(os.environ["COHORT_RESTART_COUNT"])
with open(os.path.join(state, "starts"), "a") as f:
    f.write(f"{restart} {os.environ['COHORT_MAX_RESTARTS']} {','.join(hosts)} "
            f"{os.environ['FAKE_RANKS']} {os.environ['COHORT_RUN_ATTEMPT']}\n")


def save(step):
    os.makedirs(os.path.join(checkpoints, f"step-{step:06d}"), exist_ok=True)
    with open(os.path.join(checkpoints, f"step-{step:06d}", "MANIFEST"), "w") as f:
        f.write(f"{step}\n")


def set_host(name, down):
    path = os.path.join(state, "down")
    gone = set(open(path).read().split()) if os.path.exists(path) else set()
    gone = gone | {name} if down else gone - {name}
    with open(path, "w") as f:
        f.write("\n".join(sorted(gone)) + "\n")


if scenario == "finish":
    sys.exit(0)
if scenario == "fail-once":  # fails after a checkpoint, then finishes
    if restart == 0:
        save(10)
        print("cohort: timeout on rank 1 (h2): allreduce_grad #7: not arrived", flush=True)
        sys.exit(1)
    sys.exit(0)
if scenario == "lose-h3":  # h3 is lost mid-run; the hosts left finish
    if restart == 0:
        save(20)
        set_host("h3", True)
        print("lost communication with a remote daemon on node h3", flush=True)
        sys.exit(1)
    sys.exit(0)
if scenario == "lose-h3-comes-back":  # lost, then back while the run goes on
    if restart == 0 and len(hosts) == 3:
        save(20)
        set_host("h3", True)
        print("lost communication with a remote daemon on node h3", flush=True)
        sys.exit(1)
    if len(hosts) == 2:
        set_host("h3", False)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        step = 20
        while True:  # checkpoints until cohort-run ends the job to grow
            time.sleep(0.3)
            step += 10
            save(step)
    sys.exit(0)
if scenario == "lose-h3-back-then-fail":  # lost; back when the job on 2 hosts fails
    if restart == 0:
        save(20)
        set_host("h3", True)
        print("lost communication with a remote daemon on node h3", flush=True)
        sys.exit(1)
    if restart == 1:
        set_host("h3", False)
        save(30)
        print("cohort: timeout on rank 0 (h1): allreduce_grad #3: not arrived", flush=True)
        sys.exit(1)
    sys.exit(0)
if scenario == "grow-without-checkpoints":  # h3 down at the start, then back
    if len(hosts) == 2:
        set_host("h3", False)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        time.sleep(3600)
    sys.exit(0)
if scenario == "bug-that-saves":  # the same failure each time, after a new checkpoint
    save(10 * (restart + 1))
    print("error: the same failure", file=sys.stderr, flush=True)
    sys.exit(2)
if scenario == "stubborn":  # ignores SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("training", flush=True)
    time.sleep(3600)
if scenario == "lose-one-each-time":  # the last host of each attempt lost, at once
    if len(hosts) > 1:
        set_host(hosts[-1], True)
        print(f"lost communication with a remote daemon on node {hosts[-1]}", flush=True)
        sys.exit(1)
    sys.exit(0)
if scenario == "leave-child":  # fails, leaving a child of its own behind
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(state, "child"), "w") as f:
        f.write(str(child.pid))
    print("error: failed, a child left running", file=sys.stderr, flush=True)
    os._exit(1)
if scenario == "bug":  # the same failure at every start (once after one of Open MPI's warnings)
    if restart == 1:
        print(f"[vm:{os.getpid()}] plm:rsh: Warning: setpgid({os.getpid()},{os.getpid()}) failed "
              "in parent with errno=Permission denied(13)", file=sys.stderr, flush=True)
    print(f"error on rank {restart % 2}: --global-batch 7 is not a multiple of {len(hosts)} ranks",
          file=sys.stderr, flush=True)
    sys.exit(2)
if scenario == "flaky":  # fails at once, but differently each time
    print(f"cohort: failure kind {'abcdefgh'[restart]}", flush=True)
    sys.exit(1)
if scenario == "sleep":  # runs until stopped
    print("training", flush=True)
    time.sleep(3600)
sys.exit(f"unknown scenario {scenario}")

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""cohort-run's decisions, on hosts faked by fake_mpirun.py (no MPI, no root, seconds):
  python3 cohort_run_test.py COHORT_RUN
The real thing, on simulated hosts, is test/multihost/multihost.sh's `launcher` mode."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = None  # from the command line


class CohortRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="cohort-run-test.")
        self.state = os.path.join(self.dir.name, "state")
        self.ckpt = os.path.join(self.dir.name, "ckpt")
        os.makedirs(self.state)
        self.hostfile = self.write("hosts", "# three hosts\nh1\nh2 slots=1\nh3:1\n")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def launch(self, scenario, *options, timeout=60):
        command = [sys.executable, LAUNCHER,
                   "--mpirun", f"{sys.executable} {HERE}/fake_mpirun.py {self.state}",
                   *options, "--", sys.executable, f"{HERE}/trainer.py", scenario, self.ckpt]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout + done.stderr

    def starts(self):
        with open(os.path.join(self.state, "starts")) as f:
            return [line.split() for line in f]

    def test_a_job_that_finishes_runs_once(self):
        status, out = self.launch("finish", "--hosts", self.hostfile)
        self.assertEqual(status, 0, out)
        self.assertEqual(self.starts(), [["0", "3", "h1,h2,h3", "3", "1"]])
        self.assertRegex(out, r"attempt 1 at [0-9:.]+: 3 rank\(s\) on h1 h2 h3, .* \(start\)")
        self.assertIn("summary: finished after 1 attempt(s), 0 restart(s)", out)

    def test_a_failure_restarts_on_the_same_hosts_with_the_restart_count(self):
        status, out = self.launch("fail-once", "--hosts", self.hostfile, "--max-restarts", "5",
                                  "--checkpoint-dir", self.ckpt)
        self.assertEqual(status, 0, out)
        self.assertEqual(self.starts(), [["0", "5", "h1,h2,h3", "3", "1"],
                                         ["1", "5", "h1,h2,h3", "3", "2"]])
        self.assertIn("from the start (no checkpoint yet) (start)", out)
        # The cause is the trainer's first error line, not mpirun's echoes of it.
        self.assertRegex(out, r"attempt 1 ended at .*: exit 1: cohort: timeout on rank 1 \(h2\)")
        self.assertIn("3 rank(s) on h1 h2 h3, from step 10 (restart 1 of at most 5)", out)

    def test_a_lost_host_is_left_out(self):
        status, out = self.launch("lose-h3", "--hosts", self.hostfile, "--checkpoint-dir",
                                  self.ckpt)
        self.assertEqual(status, 0, out)
        self.assertEqual([s[2:4] for s in self.starts()], [["h1,h2,h3", "3"], ["h1,h2", "2"]])
        self.assertRegex(out, r"attempt 2 at .*: 2 rank\(s\) on h1 h2 \(not answering: h3\), "
                              r"from step 20 \(restart 1 of at most 3\)")
        self.assertIn("between attempts", out)

    def test_a_host_that_does_not_answer_is_given_up_after_the_probe_timeout(self):
        open(os.path.join(self.state, "hang"), "w").close()
        begun = time.monotonic()
        status, out = self.launch("lose-h3", "--hosts", self.hostfile, "--probe-timeout", "1")
        self.assertEqual(status, 0, out)
        self.assertLess(time.monotonic() - begun, 20)
        self.assertEqual([s[2:4] for s in self.starts()], [["h1,h2,h3", "3"], ["h1,h2", "2"]])

    def test_a_host_that_comes_back_is_grown_to_after_a_checkpoint(self):
        status, out = self.launch("lose-h3-comes-back", "--hosts", self.hostfile,
                                  "--checkpoint-dir", self.ckpt, "--grow-check", "0.5")
        self.assertEqual(status, 0, out)
        # The attempt number tells a trainer grown without a failure that it was started again.
        self.assertEqual([s[2:] for s in self.starts()],
                         [["h1,h2,h3", "3", "1"], ["h1,h2", "2", "2"], ["h1,h2,h3", "3", "3"]])
        self.assertIn("3 rank(s) possible now, 2 in attempt 2: restarting to grow after its next "
                      "checkpoint", out)
        grown = re.search(r"attempt 2 ended .*: ended by cohort-run to grow, after the "
                          r"checkpoint of step (\d+)", out)
        self.assertTrue(grown, out)
        self.assertIn(f"3 rank(s) on h1 h2 h3, from step {grown.group(1)} (grow)", out)
        # A grow is not a restart after a failure.
        self.assertIn("summary: finished after 3 attempt(s), 1 restart(s), 1 grow(s)", out)

    def test_a_host_back_is_used_at_the_next_restart(self):
        status, out = self.launch("lose-h3-back-then-fail", "--hosts", self.hostfile,
                                  "--checkpoint-dir", self.ckpt)
        self.assertEqual(status, 0, out)
        self.assertEqual([s[2:4] for s in self.starts()],
                         [["h1,h2,h3", "3"], ["h1,h2", "2"], ["h1,h2,h3", "3"]])
        self.assertIn("3 rank(s) on h1 h2 h3, from step 30 (restart 2 of at most 3)", out)

    def test_a_grow_without_a_checkpoint_directory_is_at_once(self):
        with open(os.path.join(self.state, "down"), "w") as f:
            f.write("h3\n")
        status, out = self.launch("grow-without-checkpoints", "--hosts", self.hostfile,
                                  "--grow-check", "0.3")
        self.assertEqual(status, 0, out)
        self.assertEqual([s[2:4] for s in self.starts()], [["h1,h2", "2"], ["h1,h2,h3", "3"]])
        self.assertIn("restarting to grow at once", out)
        self.assertEqual(out.count("restarting to grow"), 1, out)
        self.assertIn("summary: finished after 2 attempt(s), 0 restart(s), 1 grow(s)", out)

    def test_too_few_ranks_to_restart_with(self):
        status, out = self.launch("lose-h3", "--hosts", self.hostfile, "--min-ranks", "3")
        self.assertEqual(status, 3, out)
        self.assertIn("error: the hosts that answer (h1 h2) give 2 rank(s), fewer than "
                      "--min-ranks 3 to restart with; the others: h3: ", out)

    def test_the_same_failure_with_progress_or_slow_is_not_a_bug(self):
        # A new checkpoint each time: the job got somewhere, so the restarts are used up.
        status, out = self.launch("bug-that-saves", "--checkpoint-dir", self.ckpt,
                                  "--max-restarts", "3")
        self.assertEqual(status, 3, out)
        self.assertEqual(len(self.starts()), 4)
        self.assertIn("--max-restarts are used up", out)
        # Slower than --quick-failure: not "at once" either.
        os.remove(os.path.join(self.state, "starts"))
        status, out = self.launch("bug", "--quick-failure", "0", "--max-restarts", "3")
        self.assertEqual(status, 3, out)
        self.assertEqual(len(self.starts()), 4)
        self.assertIn("--max-restarts are used up", out)

    def test_hosts_lost_one_after_another_are_not_a_bug(self):
        hosts = self.write("four", "h1\nh2\nh3\nh4\n")
        status, out = self.launch("lose-one-each-time", "--hosts", hosts)
        self.assertEqual(status, 0, out)
        self.assertEqual([s[2] for s in self.starts()],
                         ["h1,h2,h3,h4", "h1,h2,h3", "h1,h2", "h1"])

    def test_the_same_failure_at_once_stops_after_two_restarts(self):
        status, out = self.launch("bug", "--hosts", self.hostfile, "--max-restarts", "10")
        self.assertEqual(status, 3, out)
        self.assertEqual(len(self.starts()), 3)
        self.assertRegex(out, r"error: the trainer failed the same way at once after each of the "
                              r"last 2 restarts \(exit 2 within [0-9.]+ s, no new checkpoint: "
                              r"'error on rank \d: --global-batch 7 is not a multiple of 3 ranks'"
                              r"\): that is a bug in the job, not a lost host; stopping")
        self.assertIn("summary: gave up after 3 attempt(s), 2 restart(s)", out)

    def test_different_failures_use_up_the_restarts(self):
        status, out = self.launch("flaky", "--max-restarts", "3")
        self.assertEqual(status, 3, out)
        self.assertEqual(len(self.starts()), 4)
        self.assertIn("the job failed and the 3 restart(s) of --max-restarts are used up: exit 1: "
                      "cohort: failure kind d", out)

    def test_no_restarts_asked(self):
        status, out = self.launch("flaky", "--max-restarts", "0")
        self.assertEqual(status, 3, out)
        self.assertEqual(len(self.starts()), 1)

    def test_too_few_ranks_left(self):
        with open(os.path.join(self.state, "down"), "w") as f:
            f.write("h2\nh3\n")
        status, out = self.launch("finish", "--hosts", self.hostfile, "--min-ranks", "2")
        self.assertEqual(status, 3, out)
        self.assertRegex(out, r"error: the hosts that answer \(h1\) give 1 rank\(s\), fewer than "
                              r"--min-ranks 2; the others: h2: ORTE was unable .*; h3: ")
        self.assertFalse(os.path.exists(os.path.join(self.state, "starts")))

    def test_waits_for_hosts_with_host_wait(self):
        with open(os.path.join(self.state, "down"), "w") as f:
            f.write("h1\nh2\nh3\n")
        begun = time.monotonic()
        status, out = self.launch("finish", "--hosts", self.hostfile, "--host-wait", "1.5",
                                  "--probe-timeout", "0.5")
        self.assertEqual(status, 3, out)
        self.assertGreaterEqual(time.monotonic() - begun, 1.5)
        self.assertIn("no host answers, fewer than --min-ranks 1", out)
        self.assertIn("(waited 1.5 s, --host-wait)", out)

    def test_an_empty_host_file(self):
        status, out = self.launch("finish", "--hosts", self.write("empty", "# nobody\n\n"))
        self.assertEqual(status, 3, out)
        self.assertIn("error: the host file", out)
        self.assertIn("lists no host", out)

    def test_a_host_file_that_does_not_read(self):
        for text, says in (("h1 slots=x\n", "cannot read the host line 'h1 slots=x'"),
                           ("h1\nh1\n", "host 'h1' is listed twice"),
                           ("h1:0\n", "host 'h1' has 0 slots"),
                           ("me@h1\n", "'me@h1': a user in the host name is not passed on")):
            status, out = self.launch("finish", "--hosts", self.write("bad", text))
            self.assertEqual(status, 3, out)
            self.assertIn(says, out)
        status, out = self.launch("finish", "--hosts", os.path.join(self.dir.name, "missing"))
        self.assertIn("cannot read the host file", out)

    def test_a_checkpoint_directory_that_is_not_shared(self):
        with open(os.path.join(self.state, "unshared"), "w") as f:
            f.write("h2\n")
        status, out = self.launch("finish", "--hosts", self.hostfile, "--checkpoint-dir",
                                  self.ckpt)
        self.assertEqual(status, 3, out)
        self.assertIn(f"error: the checkpoint directory {self.ckpt} is not shared: h2 cannot "
                      "see the file this host wrote into it", out)
        self.assertEqual([n for n in os.listdir(self.ckpt) if n.startswith(".cohort-run")], [])

    def test_discovery(self):
        script = self.write("discover", "#!/bin/sh\necho h1:2\necho '# comment'\necho h2\n")
        os.chmod(script, 0o755)
        status, out = self.launch("finish", "--discover", script)
        self.assertEqual(status, 0, out)
        self.assertEqual(self.starts(), [["0", "3", "h1,h2", "3", "1"]])
        self.assertIn("3 rank(s) on h1:2 h2", out)
        with open(os.path.join(self.state, "calls")) as f:
            calls = f.read()
        self.assertIn("h1:2,h2:1 3 ", calls)
        self.assertNotIn("cohort-run-probe", calls)  # discovered hosts are taken as said
        self.assertEqual(self.launch("finish", "--discover", "false")[0], 3)
        self.assertEqual(self.launch("finish", "--discover", "true")[0], 3)

    def test_max_ranks_and_ranks_per_host(self):
        status, out = self.launch("finish", "--hosts", self.hostfile, "--ranks-per-host", "2",
                                  "--max-ranks", "5")
        self.assertEqual(status, 0, out)
        self.assertEqual(self.starts(), [["0", "3", "h1,h2,h3", "5", "1"]])
        self.assertIn("5 rank(s) on h1:2 h2:2 h3", out)

    def test_usage_errors(self):
        for options, says in ((["--min-ranks", "0"], "--min-ranks must be at least 1"),
                              (["--max-ranks", "1", "--min-ranks", "2"], "--max-ranks 1 is below"),
                              (["--grow-check", "1"], "--grow-check needs --hosts or --discover")):
            status, out = self.launch("finish", *options)
            self.assertEqual(status, 2, out)
            self.assertIn(says, out)
        done = subprocess.run([sys.executable, LAUNCHER, "--hosts", self.hostfile],
                              capture_output=True, text=True)
        self.assertEqual(done.returncode, 2)
        self.assertIn("no trainer", done.stderr)

    def test_what_a_failed_job_leaves_behind_is_killed(self):
        begun = time.monotonic()
        status, out = self.launch("leave-child", "--max-restarts", "0")
        self.assertEqual(status, 3, out)
        self.assertLess(time.monotonic() - begun, 10)
        with open(os.path.join(self.state, "child")) as f:
            child = int(f.read())
        time.sleep(0.2)
        with open(f"/proc/{child}/stat") if os.path.exists(f"/proc/{child}/stat") else \
                open(os.devnull) as f:
            state = f.read().split(") ")[-1][:1]
        self.assertIn(state, ("", "Z"), f"the job's child {child} still runs")
        self.assertRegex(out, r"attempt 1 ended at .* after [0-4]\.\d s: exit 1: error: failed")

    def test_a_job_that_ignores_sigterm_is_killed(self):
        command = [sys.executable, LAUNCHER, "--kill-after", "1", "--mpirun",
                   f"{sys.executable} {HERE}/fake_mpirun.py {self.state}", "--", sys.executable,
                   f"{HERE}/trainer.py", "stubborn", self.ckpt]
        launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        launcher.stdout.readline()
        self.assertEqual(launcher.stdout.readline().strip(), "training")
        begun = time.monotonic()
        launcher.send_signal(signal.SIGINT)
        out, _ = launcher.communicate(timeout=20)
        self.assertEqual(launcher.returncode, 128 + signal.SIGINT, out)
        self.assertLess(time.monotonic() - begun, 10)
        self.assertIn("stopped by SIGINT", out)

    def test_a_signal_while_waiting_for_hosts(self):
        with open(os.path.join(self.state, "down"), "w") as f:
            f.write("h1\nh2\nh3\n")
        command = [sys.executable, LAUNCHER, "--hosts", self.hostfile, "--host-wait", "60",
                   "--probe-timeout", "0.5", "--mpirun",
                   f"{sys.executable} {HERE}/fake_mpirun.py {self.state}", "--", sys.executable,
                   f"{HERE}/trainer.py", "finish", self.ckpt]
        launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        time.sleep(1.5)
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=20)
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM, out)
        self.assertIn("stopped by SIGTERM before attempt 1", out)

    def test_sigterm_ends_the_job(self):
        command = [sys.executable, LAUNCHER, "--mpirun",
                   f"{sys.executable} {HERE}/fake_mpirun.py {self.state}", "--", sys.executable,
                   f"{HERE}/trainer.py", "sleep", self.ckpt]
        launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        self.assertIn("attempt 1", launcher.stdout.readline())
        self.assertEqual(launcher.stdout.readline().strip(), "training")
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=20)
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM, out)
        self.assertIn("stopped by SIGTERM", out)
        self.assertIn("summary: stopped after 1 attempt(s)", out)


if __name__ == "__main__":
    LAUNCHER = sys.argv.pop(1)
    unittest.main(verbosity=2)

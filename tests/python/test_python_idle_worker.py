#!/usr/bin/env python3
"""DDP's pattern: every collective comes from one long-lived native worker (PyTorch's autograd
thread), which waits on a condition variable for its next task in between, while the main thread
drives it. Rank 0 then stops issuing: its main thread is busy in save_checkpoint, its worker
idle. What the rank does instead comes first: the verdict's current stack for rank 0 is the
main thread's (save_checkpoint at BUSY-LINE), not the idle worker that issued its last call,
which is still shown, after it, as the thread that issued it. A rank whose issuing thread is
itself busy (the same job without the worker: the main thread issues and then saves) keeps the
issuing thread first.
    test_python_idle_worker.py BUILD_DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, dumped  # noqa: E402
from python_jobs import marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
busy_line = marker_line("BUSY-LINE")
check = Checks(verbose=True)


def culprit(dumps):
    """The first verdict and rank 0's threads as the JSON report gives them (the current one first)."""
    j = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--json", dumps], capture_output=True,
                       text=True)
    report = json.loads(j.stdout) if j.stdout.startswith("{") else {}
    v = report["verdicts"][0] if report.get("verdicts") else {}
    return v, v.get("culprit_stacks", {}).get("0", {}).get("threads", [])


def innermost_python(thread):
    py = [f for f in (thread or {}).get("frames", []) if f.get("kind") == "python"]
    return py[0] if py else {}


# The worker: idle between steps, the main thread busy.
p, dumps, _ = run_sim_job(build, 2, 12, BUSY_RANK="0", BUSY_STEP="5", WORKER="1", until=lambda d: dumped(d, [0, 1]),
                          NATIVE_ISSUER=os.path.join(build, "lib", "libsim_native_issuer.so"))
v, threads = culprit(dumps)
check(v.get("culprit_ranks") == [0], f"rank 0 is the culprit ({v.get('cause')} {v.get('culprit_ranks')}); "
      f"launcher:\n{p.stderr[-1500:]}")
now = threads[0] if threads else {}
top = innermost_python(now)
check(now.get("role") == "main" and top.get("function") == "save_checkpoint" and top.get("line") == busy_line,
      f"the current stack is the main thread's, in save_checkpoint at line {busy_line} "
      f"({now.get('name')} {now.get('role')}: {top})")
issuer = [t for t in threads[1:] if t.get("role") == "issued_last_call"]
check(issuer and issuer[0].get("name") == "pt_autograd_0" and issuer[0].get("idle"),
      f"the worker that issued the last call follows, idle ({[(t.get('name'), t.get('role'), t.get('idle')) for t in threads]})")
text = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", dumps], capture_output=True, text=True).stdout
lines = text.splitlines()
at_now = next((i for i, l in enumerate(lines) if l.strip().startswith("now,")), -1)
check(at_now >= 0 and "the main thread" in lines[at_now] and f"save_checkpoint (" in lines[at_now + 1] and
      f"sim_job.py:{busy_line})" in lines[at_now + 1],
      f"the report's 'now' is the main thread in save_checkpoint:\n{text[-2500:]}")

# No worker: the thread that issued the last call is the busy one, and stays first.
p, dumps, _ = run_sim_job(build, 2, 12, BUSY_RANK="0", BUSY_STEP="5", until=lambda d: dumped(d, [0, 1]))
v, threads = culprit(dumps)
now = threads[0] if threads else {}
check(v.get("culprit_ranks") == [0] and now.get("role") == "issued_last_call" and
      innermost_python(now).get("line") == busy_line,
      f"without a worker, the issuing main thread stays first ({now.get('role')}, {innermost_python(now)})")
sys.exit(check.finish())

#!/usr/bin/env python3
"""Collectives issued by a native thread while the Python thread driving it waits inside a call
(as autograd's thread issues DDP's all-reduces while the main thread waits in loss.backward()):
sim_job.py over the simulator, ctypes, libncclwatch.so preloaded, NATIVE_ISSUER: each step's
all-reduce comes from a C thread of libsim_native_issuer.so while the main thread waits in it.
Rank 0 then stops issuing (busy in save_checkpoint). The issuing thread has no Python frames;
its call sites carry the main thread's, marked "driven from", and the verdict names the Python
line first; `show` and the JSON report carry it.
    test_python_driven_from.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, dumped  # noqa: E402
from python_jobs import SCRIPT as script, marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
driver_line = marker_line("DRIVER-LINE")
check = Checks(verbose=True)

p, dumps, boxes = run_sim_job(build, 2, 10, BUSY_RANK="0", BUSY_STEP="5", until=lambda d: dumped(d, [0, 1]),
                              NATIVE_ISSUER=os.path.join(build, "lib", "libsim_native_issuer.so"))
files = sorted(glob.glob(os.path.join(dumps, "rank*.json")))
check(len(files) >= 2, f"both ranks dumped ({files}); launcher:\n{p.stderr[-2000:]}")
for f in files:
    d = json.load(open(f))
    sites = d.get("callsites", [])
    check(sites and all(c.get("python_driven_from") == "main thread" for c in sites),
          f"{os.path.basename(f)}: every call site (all issued by the C thread) is driven from the main thread "
          f"({[c.get('python_driven_from') for c in sites]})")
    py = sites[0].get("python", []) if sites else []
    check(py and py[0].get("function") == "train_step" and py[0].get("line") == driver_line and
          py[0].get("file") == script, f"... with the main thread's line sim_job.py:{driver_line} innermost ({py[:1]})")
    native = [fr.get("symbol") for fr in sites[0].get("frames", [])] if sites else []
    check("Issue" in native, f"... and the C thread's own native frames ({native[:4]})")

a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", dumps], capture_output=True, text=True)
lines = a.stdout.splitlines()
at = next((i for i, l in enumerate(lines) if l.strip().startswith("rank 0 (")), -1)
want = f"during `train_step` at sim_job.py:{driver_line}, driven from the main thread"
check(at >= 0 and at + 1 < len(lines) and "issued by" in lines[at + 1] and want in lines[at + 1],
      f"the verdict's first line for rank 0 names the Python line ({lines[at + 1] if 0 <= at < len(lines) - 1 else a.stdout})")
j = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--json", dumps], capture_output=True, text=True)
report = json.loads(j.stdout) if j.stdout.startswith("{") else {"verdicts": [{}]}
v = report["verdicts"][0]
check(v.get("culprit_ranks") == [0], f"rank 0 is the culprit ({v.get('cause')} {v.get('culprit_ranks')})")
s = v.get("culprit_stacks", {}).get("0", {})
check(s.get("callsite_driven_from") == "main thread" and want in s.get("issued_by", ""),
      f"the JSON report carries it ({s.get('callsite_driven_from')}, {s.get('issued_by')})")
sig = [f for f in files if "rank00000" in f and f.endswith("-signal.json")]
show = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "show"] + sig[:1], capture_output=True, text=True)
check(sig and "driven from the main thread" in show.stdout, f"`show` marks the call site ({show.stdout[-600:]})")
sys.exit(check.finish())

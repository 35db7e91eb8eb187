#!/usr/bin/env python3
"""A real python3 job (sim_job.py, 2 ranks, simulated NCCL through ctypes, libncclwatch.so
preloaded): the dumps show the script's own file and lines, Python frames first. Three times:
NCCL called with the GIL held (ctypes.PyDLL), with the GIL released around each call
(ctypes.CDLL, as PyTorch does), and released from a ThreadPoolExecutor's worker; each time the
stalled operation's call site and the culprit's last call site in `ncclwatch analyze` name
train_step at its line.
    test_python_traces.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, dumped, end_time_limit_when, launcher_of, node_dirs, temp_dir  # noqa: E402

build = os.path.abspath(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "sim_job.py")
lines = {tag: i for i, l in enumerate(open(script), 1) for tag in ("BUSY-LINE", "CALL-LINE") if tag in l}
check = Checks(verbose=True)


def is_call_line(frames):
    return bool(frames) and frames[0]["file"].endswith("sim_job.py") and frames[0]["line"] == lines["CALL-LINE"] \
        and frames[0]["function"] == "train_step"


def run_job(name, extra_env):
    tmp = temp_dir("ncclwatch-py-")
    env = dict(os.environ, LD_PRELOAD=os.path.join(build, "lib", "libncclwatch.so"), NCCLWATCH_DIR=tmp,
               **node_dirs(temp_dir("ncclwatch-py-node-")), NCCLWATCH_TIMEOUT="3", NCCLWATCH_PEER_POLL_MS="200",
               BUSY_RANK="1", BUSY_STEP="5", **extra_env)
    # Ended once both ranks dumped, as its time limit would end it.
    with subprocess.Popen([os.path.join(build, "bin", "simlaunch"), "-n", "2", "--timeout", "10", "--", sys.executable,
                           script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as launcher:
        end_time_limit_when(launcher_of(launcher), dumped(tmp, [0, 1]))
        out, err = launcher.communicate(timeout=90)
    p = subprocess.CompletedProcess(launcher.args, launcher.returncode, out, err)
    dumps = {}
    for f in sorted(glob.glob(os.path.join(tmp, "rank*.json"))):
        d = json.load(open(f))
        dumps.setdefault(d["summary"]["rank"], []).append(d)
    check(sorted(dumps) == [0, 1], f"{name}: both ranks dumped ({sorted(dumps)}); launcher said:\n{p.stderr[-2000:]}")
    if sorted(dumps) != [0, 1]:
        return
    stall = next((d for d in dumps[0] if d["summary"]["reason"] == "stall"), None)
    check(stall is not None, f"{name}: rank 0 reported the stall")
    if stall:
        site = stall["summary"]["stalled"]["callsite"]
        cs = next((c for c in stall["callsites"] if c["id"] == site), None)
        py = cs["python"] if cs else []
        check(is_call_line(py), f"{name}: the stalled all-reduce's call site is sim_job.py:{lines['CALL-LINE']} "
                                f"in train_step ({py[:2]})")
        below = "run" if extra_env.get("POOL") == "1" else "main"  # the pool's _WorkItem.run
        check(len(py) > 1 and py[1]["function"] == below, f"{name}: and the frame below it is {below}() ({py[1:2]})")
    busy = dumps[1][0]
    frames = [f for t in busy["threads"] for f in t["python"]]
    top = next((f for f in frames if f["file"].endswith("sim_job.py")), None)
    check(top is not None and top["line"] == lines["BUSY-LINE"] and top["function"] == "save_checkpoint",
          f"{name}: the busy rank's Python stack is at sim_job.py:{lines['BUSY-LINE']} in save_checkpoint ({top})")
    check(busy["summary"]["in_nccl"] == [], f"{name}: and it is not inside NCCL")
    watchdog = [t for t in busy["threads"] if t["name"] == "ncclwatch"]
    check(len(watchdog) == 1 and watchdog[0]["own"] and not any(t["own"] for t in busy["threads"] if t["name"] != "ncclwatch"
                                                                and not t["name"].startswith("ncclwatch")),
          f"{name}: ncclwatch's watchdog thread, and only ncclwatch's threads, are marked own")
    # The culprit's last call, as the analysis shows it.
    a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--json", tmp], capture_output=True, text=True)
    try:
        report = json.loads(a.stdout)
    except ValueError:
        report = {}
    culprit = next((s for v in report.get("verdicts", []) for r, s in v.get("culprit_stacks", {}).items() if r == "1"), {})
    callsite = [f for f in culprit.get("callsite", []) if f.get("kind") == "python"]
    check(is_call_line(callsite), f"{name}: the culprit's call site in the analysis is train_step at "
                                  f"sim_job.py:{lines['CALL-LINE']} ({callsite[:1]}; {a.stderr[-500:]})")


run_job("GIL held (PyDLL)", {"NCCL_API": "pydll"})
run_job("GIL released (CDLL)", {"NCCL_API": "cdll"})
run_job("GIL released in a thread pool", {"NCCL_API": "cdll", "POOL": "1"})
sys.exit(check.finish())

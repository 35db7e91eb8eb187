#!/usr/bin/env python3
"""Last words of a Python job (sim_job.py over the simulator, ctypes, libncclwatch.so preloaded):
  - a rank SIGKILLed mid-job (NCCL called through ctypes.CDLL, the GIL released as PyTorch does):
    the host's caretaker writes its postmortem dump, and `ncclwatch analyze` names it dead with
    its last call site's Python line;
  - ranks started by multiprocessing's fork context, which end with os._exit: the one that
    leaves early writes its exit record, so it is `rank_exited`, not `rank_dead`.
    test_python_last_words.py BUILD_DIR
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, all_of, dumped  # noqa: E402
from python_jobs import analyze_json, marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
call_line = marker_line("CALL-LINE")
check = Checks(verbose=True)


def run_job(extra_env, rank1_dumps, timeout=10):
    # Ended once rank 0 has its stall dump and rank 1 its `rank1_dumps` one.
    p, dumps, boxes = run_sim_job(build, 2, timeout, BUSY_RANK="-1", NCCL_API="cdll",
                                  until=lambda d: all_of(dumped(d, [0]), dumped(d, [1], [rank1_dumps])), **extra_env)
    report = analyze_json(build, dumps, boxes)
    reasons = {}
    for f in sorted(glob.glob(os.path.join(dumps, "rank*.json"))):
        d = json.load(open(f))
        reasons.setdefault(d["summary"]["rank"], []).append(d["summary"]["reason"])
    return report, reasons, p.stderr, boxes


def python_top(stack):
    py = [f for f in stack.get("callsite", []) if f.get("kind") == "python"]
    return py[0] if py else {}


# A rank SIGKILLed between two steps: its postmortem dump, its last call site's Python line.
report, reasons, err, boxes = run_job({"DIE_RANK": "1", "DIE_STEP": "5"}, "postmortem")
check("postmortem" in reasons.get(1, []), f"SIGKILL: the dead rank has a postmortem dump ({reasons}); launcher:\n{err[-2000:]}")
v = report["verdicts"][0] if report["verdicts"] else {}
check(v.get("cause") == "rank_dead" and v.get("culprit_ranks") == [1], f"SIGKILL: rank 1 is dead ({v.get('cause')} "
                                                                        f"{v.get('culprit_ranks')})")
s = v.get("culprit_stacks", {}).get("1", {})
top = python_top(s)
check(top.get("file", "").endswith("sim_job.py") and top.get("line") == call_line and top.get("function") == "train_step",
      f"SIGKILL: its last call site is train_step at sim_job.py:{call_line} ({top})")
check("ended without a word" in s.get("where", "") and "last seen outside NCCL" in s.get("where", ""),
      f"SIGKILL: how it ended and where it was ({s.get('where')})")
check(not [f for f in os.listdir(boxes) if "ncclwatch-box-" in f], f"SIGKILL: no black box left ({os.listdir(boxes)})")

# SIGKILLed right after its first step and after its tenth (milliseconds after the call, before
# its watchdog may have polled): every operation is completed, in the state its watchdog last saw,
# or unknown; every call site has native frames (symbolized by the caretaker from raw addresses)
# and, once a poll named them, its Python line; the analysis says nothing a stale box cannot know.
UNQUALIFIED = re.compile(r"its GPU (has not finished|has not reached|is inside) ")
for steps in (1, 10):
    what = f"killed after step {steps}"
    tmp_report, reasons, err, boxes = run_job({"DIE_RANK": "1", "DIE_STEP": str(steps), "DIE_NOW": "1"}, "postmortem")
    dumps = [json.load(open(f)) for f in glob.glob(os.path.join(os.path.dirname(boxes), "dumps", "rank00001-*-postmortem.json"))]
    check(len(dumps) == 1, f"{what}: one postmortem dump ({reasons}); launcher:\n{err[-2000:]}")
    if not dumps:
        continue
    d = dumps[0]
    s = d["summary"]
    as_of = s.get("states_as_of_mono_ns", -1)
    ops = [row for row in d["ring"]["rows"] if isinstance(row, list)]
    check(len(ops) == steps, f"{what}: {steps} operations in its ring ({len(ops)})")
    states = ["pending_launch", "enqueued", "gpu_reached", "completed", "error", "captured", "unmonitored", "unknown"]
    columns = d["ring"]["columns"]
    enqueue = 0
    cell = lambda row, name: row[columns.index(name)] if columns.index(name) < len(row) else 0  # noqa: E731
    for row in ops:
        enqueue += cell(row, "enqueue_ns")
        state = states[cell(row, "state")]
        check(state in ("completed", "unknown") or (state in ("enqueued", "gpu_reached") and 0 < as_of and enqueue <= as_of),
              f"{what}: completed, as last seen, or unknown ({state}, issued {enqueue}, box as of {as_of})")
        check(enqueue <= s["time_mono_ns"], f"{what}: the dump is as of its last sign of life")
    sites = d["callsites"]
    check(sites and all(c["frames"] for c in sites), f"{what}: its call sites have native frames ({sites})")
    for c in sites:
        py = [f for f in c.get("python", []) if f.get("file", "").endswith("sim_job.py")]
        check(not py or py[0]["line"] == call_line, f"{what}: a Python line, when named, is the call's ({py})")
    v = tmp_report["verdicts"][0] if tmp_report["verdicts"] else {}
    where = v.get("culprit_stacks", {}).get("1", {}).get("where", "")
    check(v.get("cause") == "rank_dead" and not UNQUALIFIED.search(where),
          f"{what}: rank 1 dead, nothing said as fact that its box cannot know ({v.get('cause')}: {where})")

# multiprocessing's fork context: rank 1's child leaves early through os._exit.
report, reasons, err, boxes = run_job({"FORK": "1", "EXIT_RANK": "1", "EXIT_STEP": "5"}, "exit")
check(reasons.get(1) == ["exit"], f"os._exit: rank 1 wrote its exit record ({reasons}); launcher:\n{err[-2000:]}")
v = report["verdicts"][0] if report["verdicts"] else {}
check(v.get("cause") == "rank_exited" and v.get("culprit_ranks") == [1] and v.get("seq") == 6,
      f"os._exit: rank 1 exited, not dead ({v.get('cause')} {v.get('culprit_ranks')} #{v.get('seq')})")
sys.exit(check.finish())

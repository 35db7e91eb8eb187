#!/usr/bin/env python3
"""How one rank of a Python job ends while the others wait for it (sim_job.py over the
simulator, ctypes, libncclwatch.so preloaded): `ncclwatch analyze` says `rank_exited` with its
exit status, whether it aborted its communicator on the way out, and, for an uncaught exception,
the exception itself (type, message, the innermost frame of its traceback):
  - a custom exception raised in a helper, the communicator aborted in a `finally:` (as
    dist.destroy_process_group() does), NCCL called with the GIL released;
  - a built-in exception, no `finally:`, NCCL called with the GIL held;
  - sys.exit(3) and os._exit(4): the status only, no exception.
    test_python_endings.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, all_of, dumped  # noqa: E402
from python_jobs import SCRIPT as script, marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
lines = {tag: marker_line(tag) for tag in ("# RAISE-LINE", "BUILTIN-RAISE-LINE")}
check = Checks(verbose=True)


def run_job(extra_env, timeout=12):
    # Ended once rank 1's exit record and the others' stall dumps are written.
    p, dumps, boxes = run_sim_job(build, 3, timeout, NCCLWATCH_TIMEOUT="3", BUSY_RANK="-1", END_RANK="1", END_STEP="5",
                                  until=lambda d: all_of(dumped(d, [1], ["exit"]), dumped(d, [0, 2], ["stall"])),
                                  **extra_env)
    texts = {}
    for fmt in ("--json", "--no-color"):
        a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", fmt, dumps],
                           capture_output=True, text=True, env=dict(os.environ, NCCLWATCH_BLACKBOX_DIR=boxes))
        texts[fmt] = a.stdout
    try:
        report = json.loads(texts["--json"])
    except ValueError:
        report = {"verdicts": []}
    exits = {}
    for f in sorted(glob.glob(os.path.join(dumps, "rank*-exit.json"))):
        d = json.load(open(f))
        exits[d["summary"]["rank"]] = d["summary"]
    return report, texts["--no-color"], exits, p.stderr


def verdict_of(report):
    return report["verdicts"][0] if report["verdicts"] else {}


cases = [
    ("custom exception, aborted in finally, GIL released",
     {"ENDING": "raise", "ABORT_IN_FINALLY": "1", "NCCL_API": "cdll"}, 1,
     {"type": "DataError", "message": "sample 85 of shard 1 is corrupt", "function": "read_sample",
      "line": lines["# RAISE-LINE"]}, True),
    ("built-in exception, no finally, GIL held",
     {"ENDING": "raise_builtin", "NCCL_API": "pydll"}, 1,
     {"type": "ValueError", "message": "invalid literal for int() with base 16: 'not-hex'", "function": "parse_record",
      "line": lines["BUILTIN-RAISE-LINE"]}, False),
    ("sys.exit(3)", {"ENDING": "sysexit", "ABORT_IN_FINALLY": "1", "NCCL_API": "cdll"}, 3, None, True),
    ("os._exit(4)", {"ENDING": "osexit", "NCCL_API": "cdll"}, 4, None, False),
]
for name, env, status, exception, aborted in cases:
    report, text, exits, err = run_job(env)
    s1 = exits.get(1, {})
    check(s1.get("exit_status") == status, f"{name}: rank 1's exit record has status {status} ({s1.get('exit_status')}); "
                                           f"launcher:\n{err[-2000:]}")
    got = s1.get("exception")
    if exception is None:
        check(got is None, f"{name}: no exception in the exit record ({got})")
    else:
        check(got is not None and all(got.get(k) == v for k, v in exception.items()) and got.get("file") == script,
              f"{name}: the exit record names the exception {exception} ({got})")
    v = verdict_of(report)
    check(v.get("cause") == "rank_exited" and v.get("culprit_ranks") == [1] and v.get("seq") == 6,
          f"{name}: rank 1 exited before #6 ({v.get('cause')} {v.get('culprit_ranks')} #{v.get('seq')})")
    c = v.get("culprit_stacks", {}).get("1", {})
    check(c.get("state") == "exited" and c.get("exit_status") == status,
          f"{name}: its state and status ({c.get('state')}, {c.get('exit_status')})")
    check(c.get("aborted_first", False) == aborted, f"{name}: whether it aborted its communicator first ({c.get('aborted_first')})")
    where = c.get("where", "")
    check(f"exited with status {status}" in where, f"{name}: where says its status ({where})")
    check(("after ncclCommAbort" in where) == aborted, f"{name}: where says it aborted first or not ({where})")
    if exception is None:
        check("exception" not in c and "uncaught" not in text, f"{name}: no exception said ({c.get('exception')})")
    else:
        e = c.get("exception") or {}
        check(e.get("type") == exception["type"] and e.get("line") == exception["line"],
              f"{name}: the report's exception ({e})")
        said = f"uncaught {exception['type']}: {exception['message']}"
        check(said in text and f"sim_job.py:{exception['line']}" in text and "in " + exception["function"] in text,
              f"{name}: the text report says '{said}' and where it was raised:\n{text}")
    check("busy elsewhere" not in text and "rank_missing" not in text, f"{name}: not a busy rank:\n{text}")
sys.exit(check.finish())

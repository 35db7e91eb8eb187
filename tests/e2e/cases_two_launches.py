"""Two launches share one communicator (an RL trainer started as RANK 0-3 and a rollout engine
started apart as RANK 0-1, joined by a weight-sync communicator of 6 in which the rollout workers
are ranks 4-5): both repeat the same RANK numbers. Processes are told apart by host and pid,
ranks by their communicators: none is merged or dropped (sim_two_launches)."""
import glob
import json
import os
import subprocess

from e2e_common import Failure, Job, analyze, built, case, check
from ncclwatch_testing import read_text, temp_dir

TRAINER, ROLLOUT = 4, 2
SHARED = TRAINER + ROLLOUT


def two_launches(busy=None, steps=40, timeout=12):
    """Both launches side by side under the library, into one dump directory; busy=(R, S): the
    rollout engine's RANK R is stuck generating before sync step S."""
    tmp = temp_dir("ncclwatch-e2e-")
    e = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    e.update({"NCCLWATCH_DIR": os.path.join(tmp, "dumps"), "NCCLWATCH_PEER_POLL_MS": "200",
              "NCCLWATCH_BLACKBOX_DIR": os.path.join(tmp, "boxes"), "NCCLWATCH_TIMEOUT": "3",
              "LD_PRELOAD": built("lib", "libncclwatch.so"), "SIM_SHARED_DIR": os.path.join(tmp, "shared")})
    os.makedirs(e["NCCLWATCH_BLACKBOX_DIR"])
    os.makedirs(e["SIM_SHARED_DIR"])
    procs = []
    for name, n, offset, extra in (("trainer", TRAINER, 0, []),
                                   ("rollout", ROLLOUT, TRAINER, ["--busy", "%d:%d" % busy] if busy else [])):
        cmd = [built("bin", "simlaunch"), "-n", str(n), "--timeout", str(timeout), "--",
               built("bin", "sim_two_launches"), "--offset", str(offset), "--shared-size", str(SHARED),
               "--steps", str(steps)] + extra
        out, err = open(os.path.join(tmp, name + ".out"), "w"), open(os.path.join(tmp, name + ".err"), "w")
        with out, err:
            procs.append(subprocess.Popen(cmd, env=e, cwd=tmp, stdout=out, stderr=err))
    try:
        for p in procs:
            p.wait(timeout=timeout + 60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    err = read_text(os.path.join(tmp, "trainer.err")) + read_text(os.path.join(tmp, "rollout.err"))
    return Job(max(p.returncode for p in procs), "", err, tmp)


def rollout_process(j, launch_rank):
    """(host, pid) of the rollout engine's RANK `launch_rank`: its dump has the shared
    communicator (size 6) at rank 4 + launch_rank."""
    for path in glob.glob(os.path.join(j.dir, "rank*.json")):
        with open(path) as f:
            s = json.load(f)["summary"]
        if any(c["size"] == SHARED and c["rank"] == TRAINER + launch_rank for c in s["comms"]):
            return s["host"], s["pid"]
    raise Failure(f"no dump holds rank {TRAINER + launch_rank} of the shared communicator: {os.listdir(j.dir)}")


@case
def two_launches_stuck_rollout_worker():
    # The rollout engine's RANK 1 (rank 5 of the weight-sync communicator) is stuck generating
    # before sync step 10: the trainer's four ranks and rollout RANK 0 wait in Broadcast #10.
    j = two_launches(busy=(1, 10))
    host, pid = rollout_process(j, 1)
    rc, report, text = analyze(j)
    vs = report["verdicts"]
    what = json.dumps(vs, indent=1)[:3000] + "\n" + text[:4000]
    check(rc == 1 and vs and vs[0]["cause"] == "rank_missing", f"rank_missing (exit {rc}):\n{what}")
    check("another process claims rank" not in text, f"no process dropped for its RANK:\n{text[:4000]}")
    check("left no dump" not in text and "global rank unknown" not in text,
          f"the stuck worker dumped: it is never called dumpless:\n{text[:4000]}")
    check("2 launches share communicator" in text, f"the report says the dumps hold two launches:\n{text[:2000]}")
    check(f"rank 5 (RANK 1 of launch 2; {host}, pid {pid})" in text,
          f"the stuck worker named by its rank in the shared communicator, its RANK, host and pid:\n{what}")
    # Its own stack, under its own name: the busy function appears with the worker's pid only.
    stacks = vs[0]["culprit_stacks"]
    check(len(stacks) == 1, f"one culprit: {list(stacks)}")
    s = next(iter(stacks.values()))
    check(s["pid"] == pid and s.get("comm_rank") == 5 and s.get("launch_rank") == 1,
          f"the culprit is the rollout worker (pid {pid}, comm rank 5, RANK 1): {json.dumps(s)[:800]}")
    check("generate_rollouts" in json.dumps(s), f"with its own stack (generate_rollouts): {json.dumps(s)[:1500]}")
    # Trainer RANK 1 waits in the broadcast like every other member: never described with the
    # worker's stack.
    check(text.count("generate_rollouts") >= 1, f"the busy function in the text:\n{text[:4000]}")
    check(not any("rank 1" in l and "has not created this communicator" in l for l in text.splitlines()),
          f"the trainer's rank 1 is not described with the worker's stack:\n{text[:4000]}")


@case
def two_launches_healthy():
    j = two_launches(steps=20, timeout=30)
    check(j.rc == 0, f"both launches succeed (exit {j.rc}):\n{j.err[-2000:]}")
    rc, report, text = analyze(j)
    check(rc == 0 and [v["cause"] for v in report["verdicts"]] == ["no_hang"], f"no hang (exit {rc}):\n{text[:1500]}")
    check("another process claims rank" not in text, f"no process dropped:\n{text[:2000]}")

"""Last words: what a rank knew survives SIGKILL (its black box, read by the host's caretaker)
and _exit (the same exit record as exit())."""
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time

from e2e_common import (analyze, analyze_dir, built, case, first_verdict, host_dirs, job, kill_after_stall, long_case,
                        rank_pid, ring_entries)
from ncclwatch_testing import (all_of, check, dumped, wait_for, wait_for_ranks)


def files_in(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def boxes(j):
    return [f for f in files_in(os.path.join(j.tmp, "boxes")) if "ncclwatch-box-" in f]


def caretaker_pid(p):
    """The pid of the job's host caretaker (the holder of its flock)."""
    ns = f"{os.stat('/proc/self/ns/mnt').st_ino}-{os.stat('/proc/self/ns/pid').st_ino}"  # one per namespaces
    lock = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "boxes", f"ncclwatch-caretaker-{os.getuid()}-{ns}.lock")
    wait_for(lambda: os.path.exists(lock), "the caretaker's lock")
    inode = os.stat(lock).st_ino

    def holder():
        for line in open("/proc/locks"):
            f = line.split()
            if len(f) > 5 and f[1] == "FLOCK" and f[5].endswith(f":{inode}"):
                return int(f[4])
        return None
    return wait_for(holder, "a caretaker")


def postmortem_where(j, rank, cause="rank_dead"):
    """The verdict naming `rank` dead, and what it says of where it was."""
    rc, report, text = analyze(j)
    v = next((v for v in report["verdicts"] if v["cause"] == cause and rank in v["culprit_ranks"]), None)
    check(v is not None, f"a {cause} verdict names rank {rank}:\n{json.dumps(report['verdicts'], indent=1)[:3000]}")
    return v, v["culprit_stacks"][str(rank)], text


@case
def last_words_sigkill_inside_nccl():
    # Rank 2 is SIGKILLed inside its all-reduce #40 (the OOM killer's way). The host's caretaker
    # turns its black box into a postmortem dump: where it was, its last operations, its call site.
    j = job(4, ["--iters", "400", "--jitter-ms", "20", "--seed", "3"],
            env={"NCCLWATCH_TIMEOUT": "2", "NCCLWATCH_SIM_FAULT": "crash:rank=2,seq=40"}, timeout=10)
    d = j.first(2, "postmortem")
    s = d["summary"]
    check(s["detail"].startswith(("ended without a word", "killed by the kernel's OOM killer")), f"how: {s['detail']}")
    check([t["function"] for t in s["in_nccl"]] == ["ncclAllReduce"], f"inside ncclAllReduce: {s['in_nccl']}")
    check(s["comms"][0]["last_enqueued"] == 40, f"its sequence state: {s['comms']}")
    last = [o for o in s["in_flight"] if o["seq"] == 40]
    check(last and last[0]["state"] in ("enqueued", "pending_launch"), f"#40 is in flight: {s['in_flight'][-2:]}")
    sites = {c["id"]: c for c in d["callsites"]}
    check(last[0]["callsite"] in sites, f"its call site was resolved while it lived: {sorted(sites)}")
    check(any(f.get("symbol", "").startswith("main") for f in sites[last[0]["callsite"]]["frames"]),
          f"named: {sites[last[0]['callsite']]['frames'][:4]}")
    check(any("rank 2 (pid" in l and "ended without a word" in l for l in j.ncclwatch_lines()),
          f"the caretaker said it:\n{j.err[-2000:]}")
    v, where, text = postmortem_where(j, 2)
    check(v["seq"] == 40 and "ended without a word" in where["where"] and "inside ncclAllReduce" in where["where"],
          f"where: {where['where']} (#{v['seq']})")
    check(where["callsite_op"].startswith("AllReduce #40") and where["callsite"], f"its call site: {where}")
    check("ended without a word" in text and "dmesg" in text, f"the report says how and what to check:\n{text[:2500]}")
    check("without a word (ended without a word" not in text and "call site are above" in text and
          text.find("issued at" if "issued at" in text else "called from") < text.find("advice:"),
          f"said once, and the advice points up at the call site printed before it:\n{text[:2500]}")


# What a stale black box cannot know is never said as fact: a rank's GPU work that its watchdog
# did not see finish is "unknown", or "not finished at its black box's last update", never "its
# GPU has not finished".
UNQUALIFIED = re.compile(r"its GPU (has not finished|has not reached|is inside) ")


def check_box_mirrors(d, calls):
    """A postmortem dump of a rank that synchronized its stream after each of `calls` operations
    and was then killed: every operation is completed, or in the state its watchdog last saw
    (before `states_as_of_mono_ns`), or unknown; and each has its call site's native frames."""
    s = d["summary"]
    as_of = s.get("states_as_of_mono_ns")
    check(isinstance(as_of, int) and as_of >= 0, f"how fresh the box is: {as_of}")
    ops = sorted(ring_entries(d), key=lambda o: o["enqueue_ns"])
    check(len(ops) == calls and all(o["enqueue_ns"] > 0 for o in ops), f"{calls} operations with their issue times: {ops}")
    check(s["time_mono_ns"] >= ops[-1]["enqueue_ns"], f"as of its last sign of life: {s['time_mono_ns']} < {ops[-1]}")
    for i, o in enumerate(ops):
        later = ops[i + 1]["enqueue_ns"] if i + 1 < len(ops) else None
        if later is not None and as_of and later < as_of:
            # Finished before the next was issued (the stream was synchronized), seen by a poll.
            check(o["state"] == "completed", f"#{o['seq']} finished before {as_of}: {o}")
        if o["state"] == "completed":
            check(o["enqueue_ns"] < o["gpu_reached_ns"] <= o["completed_ns"] <= s["time_mono_ns"],
                  f"#{o['seq']}: the times its watchdog discovered it reached and completed: {o}")
        elif o["state"] in ("enqueued", "gpu_reached"):
            check(0 < as_of and o["enqueue_ns"] <= as_of, f"#{o['seq']} {o['state']} as its watchdog saw it at {as_of}: {o}")
        else:
            check(o["state"] == "unknown", f"#{o['seq']}: completed, seen, or unknown: {o}")
    sites = {c["id"]: c for c in d["callsites"]}
    for o in ops:
        frames = sites.get(o["callsite"], {}).get("frames", [])
        check(frames and d["modules"][frames[0]["module"]]["path"], f"#{o['seq']}'s call site has frames: {sites}")
    return ops, sites


def check_no_stale_fact(where, ops):
    check(not UNQUALIFIED.search(where), f"a stale box's states said as fact: {where}")
    if any(o["state"] == "unknown" for o in ops) or not ops:
        check("unknown" in where or "black box is as of" in where, f"how fresh its box is: {where}")


def killed_after(calls):
    j = job(3, ["--iters", "40", "--jitter-ms", "40", "--seed", "5", "--exit-rank", "1", "--exit-at", str(calls),
                "--kill-self"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=9)
    ops, sites = check_box_mirrors(j.first(1, "postmortem"), calls)
    for o in ops:
        frames = sites[o["callsite"]]["frames"]
        check(any(f.get("symbol", "").startswith("main") for f in frames), f"#{o['seq']}: named down to main: {frames}")
    v, where, text = postmortem_where(j, 1)
    check_no_stale_fact(where["where"], ops)
    check(where["callsite_op"].startswith(f"AllReduce #{calls}") and where["callsite"], f"its last call site: {where}")


@case
def last_words_killed_after_first_call():
    # SIGKILLed right after its first all-reduce (synchronized): milliseconds into the job,
    # before its watchdog's first poll. Its call site's frames come from the raw addresses in its
    # black box; what its GPU did is unknown, not "has not finished #1".
    killed_after(1)


@case
def last_words_killed_after_tenth_call():
    # The same after its tenth: the operations its watchdog saw finish are completed in the box,
    # with the times it saw them; the rest are in the state it last saw, or unknown.
    killed_after(10)


@case
def last_words_sigkill_outside_nccl():
    # Rank 2 stops outside NCCL after #20 (a save); the others stall in #21 and dump; then it is
    # SIGKILLed. Its postmortem says it was outside NCCL after #20, not that it left no dump.
    j = job(4, ["--iters", "200", "--busy-rank", "2", "--busy-at", "20", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=15, after_start=lambda p: kill_after_stall(p, 2),
            until=lambda d: all_of(dumped(d, [0, 1, 3], ["stall"]), dumped(d, [2], ["postmortem"])))
    v, where, text = postmortem_where(j, 2)
    check(v["seq"] == 21, f"the others wait in #21: #{v['seq']}")
    check("last seen outside NCCL" in where["where"] and "#20" in where["where"], f"where: {where['where']}")


@case
def last_words_default_and_relative_dir():
    # The postmortem of a rank SIGKILLed before its first dump lands where the job's dumps are:
    # with NCCLWATCH_DIR unset (./ncclwatch-<job> in the job's directory) and with a relative
    # NCCLWATCH_DIR, whichever directory the caretaker runs in.
    for setting in ("", "rel-dumps"):
        def kill_busy(p, setting=setting):
            cwd = os.path.realpath(f"/proc/{p.pid}/cwd")
            pattern = os.path.join(cwd, setting or "ncclwatch-*", "rank00001-*-postmortem.json")
            pid = rank_pid(p, 1)
            time.sleep(1.0)  # rank 1 is past its busy point, before any dump
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: glob.glob(pattern), f"rank 1's postmortem dump in {pattern}")
            p.send_signal(signal.SIGUSR1)  # what the case waits for is written: the time limit, now
        j = job(2, ["--iters", "200", "--busy-rank", "1", "--busy-at", "5", "--busy-ms", "-1"],
                env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_DIR": setting}, timeout=15, after_start=kill_busy)
        found = glob.glob(os.path.join(j.tmp, setting or "ncclwatch-*", "rank00001-*-postmortem.json"))
        check(found, f"NCCLWATCH_DIR={setting!r}: rank 1's postmortem in the job's directory:\n{j.err[-1500:]}")


@case
def last_words_caretaker_killed():
    # The host's caretaker itself is SIGKILLed: the next process elected converts its black box.
    def kill_caretaker(p):
        pid = caretaker_pid(p)
        killed["pid"] = pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: glob.glob(os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps",
                                                f"rank*-{pid}-*-postmortem.json")), "its postmortem dump")
    killed = {}
    j = job(3, ["--iters", "2000", "--jitter-ms", "5"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=10,
            after_start=kill_caretaker)
    pm = [d for ds in j.dumps().values() for d in ds if d["summary"]["reason"] == "postmortem"]
    check([d["summary"]["pid"] for d in pm] == [killed["pid"]], f"one postmortem, the caretaker's: {pm}")
    check(not boxes(j), f"no black box left: {boxes(j)}")


@case
def last_words_fork_started_rank_exits():
    # Each rank forks; the child does the work (as Python's multiprocessing fork context does)
    # and rank 2's child leaves early through _exit: an exit record, so rank_exited, not rank_dead.
    j = job(4, ["--fork", "--iters", "20", "--exit-rank", "2", "--exit-at", "5"], env={"NCCLWATCH_TIMEOUT": "2"},
            timeout=8)
    d = j.first(2, "exit")
    check(d["summary"]["exit_status"] == 0, f"its exit status: {d['summary']['exit_status']}")
    exiting = [t for t in d["threads"] if t["name"] == "exiting thread"]
    check(exiting and any(f.get("symbol", "").startswith("main") for f in exiting[0]["frames"]), f"the exiting thread's stack: {exiting}")
    pids = {x["summary"]["pid"] for ds in j.dumps().values() for x in ds}
    check(len(pids) == 4, f"only the children (which used NCCL) wrote dumps: {sorted(pids)}")
    first_verdict(j, "rank_exited", [2], seq=6)
    check(not boxes(j), f"no black box left: {boxes(j)}")


@case
def last_words_pipeline_stage_leaves():
    # Stage 0 sends all its microbatches and leaves through _exit; stage 2 stops before #4.
    # The stopped stage is named; the stage that left is not called dead.
    j = job(3, ["--microbatches", "8", "--stop-rank", "2", "--stop-at", "3", "--quick-exit"], program="sim_pipeline",
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    check(j.first(0, "exit")["summary"]["exit_status"] == 0, "stage 0 left an exit record")
    rc, report, text = analyze(j)
    check(report["verdicts"][0]["culprit_ranks"] == [2], f"stage 2 is named:\n{json.dumps(report['verdicts'])[:2000]}")
    dead = [v for v in report["verdicts"] if v["cause"] == "rank_dead"]
    check(not dead, f"no rank is called dead: {dead}")


@case
def ended_rank_owing_nothing_is_not_blamed():
    # Stage 0 sends its last microbatch (to stage 1, and straight to the last stage in one group)
    # and exits with status 0; stage 2 stops; stage 1 and stage 3 wait, stage 3 in a group that
    # also holds its (matched) receive from stage 0. Stage 0's counts toward its peers match what
    # they issued toward it: it owes nothing, and no verdict names it. Stage 2 is named.
    j = job(4, ["--microbatches", "4", "--stop-rank", "2", "--stop-at", "3", "--skip"], program="sim_pipeline",
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    check(j.first(0, "exit")["summary"]["exit_status"] == 0, "stage 0 left an exit record")
    rc, report, text = analyze(j)
    verdicts = report["verdicts"]
    check(verdicts and verdicts[0]["culprit_ranks"] == [2], f"stage 2 is named first:\n{json.dumps(verdicts)[:2000]}")
    blamed = [v for v in verdicts if 0 in v["culprit_ranks"]]
    check(not blamed, f"stage 0, which owed nothing, is never named: {json.dumps(blamed)[:1500]}")


@case
def last_words_whole_job_killed_then_next_job():
    # Every rank of a job is SIGKILLed: nobody is left on the host to read their black boxes.
    # The next job's caretaker on the host converts them into the first job's dump directory and
    # removes them and the first job's relay files: nothing accumulates.
    boxes_dir, relay_dir, host = host_dirs()

    def kill_all(p):
        pids = wait_for_ranks(p, 3)
        wait_for(lambda: len(glob.glob(os.path.join(boxes_dir, "ncclwatch-box-*"))) == 3, "3 black boxes")
        wait_for(lambda: glob.glob(os.path.join(relay_dir, "ncclwatch-relay-*")), "the relay")
        time.sleep(0.5)  # a few polls: call sites resolved
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    first = job(3, ["--iters", "100000", "--jitter-ms", "5"], env=host, timeout=20, after_start=kill_all)
    check(not first.dumps(), f"the first job wrote nothing itself: {first.dumps()}")
    check(len(glob.glob(os.path.join(boxes_dir, "ncclwatch-box-*"))) == 3, "its black boxes are left")
    time.sleep(5)  # its leftovers are old enough to be nobody's start-up
    second = job(2, ["--iters", "5", "--linger-ms", "1500"], env=host, timeout=15)
    check(second.rc == 0, f"the second job ran: {second.err[-1500:]}")
    check(sorted(first.dumps()) == [0, 1, 2] and all(first.reasons(r) == ["postmortem"] for r in range(3)),
          f"the first job's ranks each have a postmortem dump: {[first.reasons(r) for r in range(3)]}")
    left = [f for f in files_in(boxes_dir) + files_in(relay_dir) if "caretaker" not in f]
    check(not left, f"nothing left on the host: {left}")


@case
def hung_job_killed_then_next_job_leaves_nothing():
    # A job hangs (rank 1 stops; the others stall, dump and relay the job-wide request), then
    # every rank is SIGKILLed, and one healthy job runs on the host right after: the black box and
    # relay directories are empty afterwards (nothing of the hung job, nothing of the healthy one).
    boxes_dir, relay_dir, host = host_dirs()

    def kill_when_hung(p):
        pids = wait_for_ranks(p, 3)
        dumps = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps")
        wait_for(lambda: len(glob.glob(os.path.join(dumps, "rank*-peer_request.json"))) >= 1, "the hung job's dumps")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    first = job(3, ["--iters", "100", "--busy-rank", "1", "--busy-at", "5", "--busy-ms", "-1"], env=host, timeout=20,
                after_start=kill_when_hung)
    check(files_in(relay_dir), "the hung job left relay files behind")
    second = job(2, ["--iters", "5", "--linger-ms", "1500"], env=host, timeout=15)
    check(second.rc == 0, f"the second job ran: {second.err[-1500:]}")
    left = [f for f in files_in(boxes_dir) + files_in(relay_dir) if "caretaker" not in f]
    check(not left, f"nothing left on the host: {left}")
    check(all("postmortem" in first.reasons(r) for r in range(3)),
          f"the hung job's ranks were converted: {[first.reasons(r) for r in range(3)]}")


@case
def last_words_recovered_stall_then_death():
    # Rank 1 saves slowly (a stall that recovers: it answered a request then), then is SIGKILLed
    # in #60. The verdict is its death at #60, not the earlier stall.
    j = job(4, ["--iters", "400", "--busy-rank", "1", "--busy-at", "5", "--busy-ms", "3000", "--jitter-ms", "4"],
            env={"NCCLWATCH_TIMEOUT": "1", "NCCLWATCH_SIM_FAULT": "crash:rank=1,seq=60"}, timeout=12)
    check("peer_request" in j.reasons(1), f"rank 1 answered during its slow save: {j.reasons(1)}")
    v = first_verdict(j, "rank_dead", [1], seq=60)
    check("ended without a word" in v["culprit_stacks"]["1"]["where"], f"where: {v['culprit_stacks']['1']['where']}")


@long_case(16)
def last_words_gone_before_teardown():
    # Without black boxes: rank 1 answered a request during a slow save, then was SIGKILLed; the
    # others answer the launcher's SIGTERM much later. Its old dump is not read as rank_missing.
    j = job(4, ["--iters", "400", "--busy-rank", "1", "--busy-at", "5", "--busy-ms", "3000", "--jitter-ms", "4"],
            env={"NCCLWATCH_TIMEOUT": "1", "NCCLWATCH_SIM_FAULT": "crash:rank=1,seq=60",
                 "NCCLWATCH_BLACKBOX_DIR": "none"}, timeout=16)
    check("postmortem" not in j.reasons(1) and "peer_request" in j.reasons(1), f"rank 1: {j.reasons(1)}")
    v = first_verdict(j, "rank_dead", [1])
    check("gone before the job's teardown" in v["culprit_stacks"]["1"]["where"], f"where: {v['culprit_stacks']['1']}")


def snapshot(*dirs):
    """Every file under `dirs`: its path and a hash of its bytes (a directory that is missing
    is recorded as missing)."""
    seen = {}
    for top in dirs:
        if not os.path.isdir(top):
            seen[top] = "missing"
            continue
        for root, subdirs, names in os.walk(top):
            seen[root] = "dir"
            for n in names:
                p = os.path.join(root, n)
                with open(p, "rb") as f:
                    seen[p] = hashlib.sha256(f.read()).hexdigest()
    return seen


@case
def reading_commands_change_nothing():
    # Every rank of a job on a host is SIGKILLed at once (torchrun's workers killed, an OOM-killed
    # node): no caretaker is left to turn the black boxes into dumps. `analyze`, `timeline` and
    # `dump`'s analysis read; they change nothing (the dump directory, the black boxes and the
    # relay files are byte for byte what they were) and still tell the dead ranks' story, from
    # the boxes read in memory, saying so in one line. `ncclwatch collect` then writes the dumps.
    boxes_dir, relay_dir, host = host_dirs()
    stop_at = 6

    def hang_then_kill_all(p):
        pids = wait_for_ranks(p, 3)
        dumps = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps")
        # Rank 1 stops before collective #stop_at; the others stall and dump, then all are killed.
        wait_for(lambda: len(glob.glob(os.path.join(dumps, "rank*-stall.json"))) >= 2, "the others' stall dumps")
        time.sleep(0.5)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    j = job(3, ["--iters", "100", "--busy-rank", "1", "--busy-at", str(stop_at), "--busy-ms", "-1"], env=host,
            timeout=20, after_start=hang_then_kill_all)
    check(len(glob.glob(os.path.join(boxes_dir, "ncclwatch-box-*"))) == 3, f"the job's black boxes are left: "
          f"{files_in(boxes_dir)}\n{j.err[-1500:]}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_")}
    env.update(NCCLWATCH_BLACKBOX_DIR=boxes_dir, NCCLWATCH_RELAY_DIR=relay_dir)
    nw = built("bin", "ncclwatch")
    before = snapshot(j.dir, boxes_dir, relay_dir)
    a = subprocess.run([nw, "analyze", "--json", j.dir], env=env, capture_output=True, text=True)
    t = subprocess.run([nw, "timeline", j.dir, "-o", "-"], env=env, capture_output=True, text=True)
    text = subprocess.run([nw, "analyze", "--no-color", j.dir], env=env, capture_output=True, text=True)
    after = snapshot(j.dir, boxes_dir, relay_dir)
    check(before == after, "the reading commands changed nothing: "
          f"{sorted(set(before.items()) ^ set(after.items()))}\n{a.stderr[-1500:]}")
    check(a.returncode == 1, f"a hang ({a.returncode}):\n{a.stderr[-1500:]}")
    report = json.loads(a.stdout)
    dead = [v for v in report["verdicts"] if v["cause"] == "rank_dead"]
    check(dead and all(set(v["culprit_ranks"]) <= {0, 1, 2} for v in dead),
          f"the ranks' deaths are told from their boxes: {json.dumps(report['verdicts'])[:2000]}")
    lines = [l for l in a.stderr.splitlines() if "read in memory" in l]
    check(len(lines) == 1 and "3 process(es)" in lines[0] and "ncclwatch collect" in lines[0] and boxes_dir in lines[0],
          f"one line says which boxes were read and how to make dumps of them:\n{a.stderr[-1500:]}")
    check(t.returncode == 0 and json.loads(t.stdout)["traceEvents"], f"the timeline too:\n{t.stderr[-1500:]}")
    check("postmortem" in text.stdout or "without a word" in text.stdout, f"the text says how they ended:\n{text.stdout[-2000:]}")
    # Another job's directory (a copy of this job's dumps elsewhere): these boxes are not its own,
    # and are neither read nor named.
    other = os.path.join(j.tmp, "other-job")
    os.makedirs(other)
    for f in glob.glob(os.path.join(j.dir, "rank*.json")):
        shutil.copy(f, other)
    o = subprocess.run([nw, "analyze", "--json", other], env=env, capture_output=True, text=True)
    check(o.returncode in (0, 1) and "read in memory" not in o.stderr and boxes_dir not in o.stdout + o.stderr,
          f"another job's analysis reads none of these boxes:\n{o.stderr[-1500:]}\n{o.stdout[-1500:]}")

    # The command that says it converts: the postmortem dumps are written, the boxes gone; the
    # analysis then reads the dumps (no line about boxes) and tells the same deaths.
    c = subprocess.run([nw, "collect", j.dir], env=env, capture_output=True, text=True)
    check(c.returncode == 0 and c.stderr.count("its black box is now") == 3, f"collect converted the 3 boxes:\n{c.stderr}")
    check(sorted(r for r in j.dumps() if "postmortem" in j.reasons(r)) == [0, 1, 2],
          f"each rank has its postmortem dump: {[j.reasons(r) for r in range(3)]}")
    check(not glob.glob(os.path.join(boxes_dir, "ncclwatch-box-*")), f"no box left: {files_in(boxes_dir)}")
    a2 = subprocess.run([nw, "analyze", "--json", j.dir], env=env, capture_output=True, text=True)
    check("read in memory" not in a2.stderr, f"nothing left to read in memory:\n{a2.stderr[-1500:]}")
    again = json.loads(a2.stdout)
    check([(v["cause"], v["culprit_ranks"]) for v in again["verdicts"]] ==
          [(v["cause"], v["culprit_ranks"]) for v in report["verdicts"]],
          f"the same story from the dumps: {json.dumps(again['verdicts'])[:1500]}\n{json.dumps(report['verdicts'])[:1500]}")
    c2 = subprocess.run([nw, "collect"], env=env, capture_output=True, text=True)
    check(c2.returncode == 0 and "no black box" in c2.stderr, f"nothing left to collect: {c2.stderr}")


@case
def killed_before_any_dump_still_told():
    # Every rank SIGKILLed before any of them dumped: the dump directory was never made. analyze
    # on it still tells the story from the black boxes (read in memory) and creates nothing.
    boxes_dir, relay_dir, host = host_dirs()

    def kill_all(p):
        pids = wait_for_ranks(p, 3)
        wait_for(lambda: len(glob.glob(os.path.join(boxes_dir, "ncclwatch-box-*"))) == 3, "3 black boxes")
        time.sleep(0.5)  # a few polls: call sites resolved
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    j = job(3, ["--iters", "100000", "--jitter-ms", "5"], env=host, timeout=20, after_start=kill_all)
    check(not os.path.exists(j.dir), f"no dump directory: {files_in(j.dir)}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_")}
    env.update(NCCLWATCH_BLACKBOX_DIR=boxes_dir, NCCLWATCH_RELAY_DIR=relay_dir)
    before = snapshot(j.dir, boxes_dir, relay_dir)
    a = subprocess.run([built("bin", "ncclwatch"), "analyze", "--json", j.dir], env=env, capture_output=True,
                       text=True)
    check(snapshot(j.dir, boxes_dir, relay_dir) == before, "analyze changed nothing")
    check(a.returncode == 0 and "read in memory" in a.stderr,
          f"told from the boxes; killed at once, no hang ({a.returncode}):\n{a.stderr[-1500:]}")
    report = json.loads(a.stdout)
    check(report["verdicts"][0]["cause"] == "job_killed" and report["verdicts"][0]["killed_ranks"] == [0, 1, 2],
          f"the deaths, one kill: {json.dumps(report['verdicts'])[:1500]}")


@case
def rank_that_reexecutes_itself_is_no_death():
    # A rank that re-executes itself after NCCL started (an in-place restart: the same pid, a new
    # program). Its earlier program's black box loses its lock with the execve, but that is no
    # death: no "ended without a word", no postmortem; the box goes quietly, the new program's
    # is the live one, and analyze sees one attempt, the new program's. The same when the new
    # program stalls.
    for hang in (False, True):
        env = {"NCCLWATCH_LOG": "info", "NCCLWATCH_TIMEOUT": "1" if hang else "600"}
        if hang:  # only the new program reaches #8 (the first runs 5)
            env["NCCLWATCH_SIM_FAULT"] = "kernel:rank=0,seq=8,ms=3000"
        j = job(1, ["reexec"], env=env, timeout=40, program="e2e_resource_app")
        what = "a stalled new program" if hang else "a healthy new program"
        check(j.rc == 0 and "re-executing" in j.out and "the new program ends" in j.out,
              f"{what}: it ran both programs: {j.rc} {j.out!r}\n{j.err[-2000:]}")
        check("without a word" not in j.err and "SIGKILL" not in j.err, f"{what}: no death told:\n{j.err[-3000:]}")
        check(any("re-executed itself" in l for l in j.ncclwatch_lines()),
              f"{what}: the earlier program's box is said gone (info):\n{j.err[-3000:]}")
        reasons = j.reasons(0)
        check("postmortem" not in reasons and reasons[-1:] == ["exit"] and ("stall" in reasons) == hang,
              f"{what}: the new program's dumps only: {reasons}")
        check(boxes(j) == [], f"{what}: no black box left: {boxes(j)}")
        rc, report, text = analyze(j)
        check(len(report.get("attempts") or [None]) == 1, f"{what}: one attempt: {report.get('attempts')}")
        check(all(v["cause"] != "rank_dead" for v in report["verdicts"]),
              f"{what}: nobody dead:\n{json.dumps(report['verdicts'], indent=1)[:2000]}")


# A rank stopped (kill -STOP, a debugger, a frozen cgroup) is alive and answers nothing: the
# host's caretaker sees it in /proc and writes a stand-in dump for it from its black box; it is
# rank_stopped while stopped, and stays so once the launcher kills it (not an OOM story). One
# continued before the end is no verdict at all: its own later dumps say what it did.

def stop_a_rank(p, seen, the_caretaker=False):
    """SIGSTOPs a rank that is not the host's caretaker (or, with the_caretaker, the one that is:
    the others must see it) once the job has run for a second; waits for its stand-in dump.
    Returns the dumps directory."""
    dumps = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps")
    caretaker = caretaker_pid(p)
    rank = next(r for r in (2, 1, 3, 0) if (rank_pid(p, r) == caretaker) == the_caretaker)
    pid = rank_pid(p, rank)
    time.sleep(1.0)  # some collectives done
    os.kill(pid, signal.SIGSTOP)
    seen.update(rank=rank, pid=pid)
    stand_in = wait_for(lambda: glob.glob(os.path.join(dumps, f"rank{rank:05d}-*-stopped.json")), f"rank {rank}'s stand-in")
    seen["stand_in"] = json.load(open(stand_in[0]))
    seen["stand_in_file"] = os.path.basename(stand_in[0])
    return dumps


@case
def stopped_rank_is_stopped_then_killed():
    stopped_then_killed(the_caretaker=False)


@case
def stopped_caretaker_is_stopped_then_killed():
    # The host's caretaker stopped: its lock stays held, so the other ranks see the stop.
    stopped_then_killed(the_caretaker=True)


def stopped_then_killed(the_caretaker):
    seen = {}

    def stop_then_kill(p):
        dumps = stop_a_rank(p, seen, the_caretaker)
        # While it is stopped, the job's dumps already say so (what `ncclwatch run` prints live),
        # once the others have dumped their stall.
        others = [o for o in range(4) if o != seen["rank"]]
        wait_for(lambda: all(glob.glob(os.path.join(dumps, f"rank{o:05d}-*.json")) for o in others),
                 "the waiting ranks' dumps")
        rc, report = analyze_dir(dumps)
        seen["live"] = report
        os.kill(seen["pid"], signal.SIGKILL)  # the launcher gives up on it
        wait_for(lambda: glob.glob(os.path.join(dumps, f"rank{seen['rank']:05d}-*-postmortem.json")), "its postmortem")
        p.send_signal(signal.SIGTERM)  # and tears the job down
    j = job(4, ["--iters", "100000", "--jitter-ms", "20", "--seed", "7"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=60,
            after_start=stop_then_kill)
    r, s = seen["rank"], seen["stand_in"]["summary"]
    check(s["stopped"]["how"] == "stopped" and s["stopped"]["seen_unix_ns"] > 0, f"the stand-in says how: {s['stopped']}")
    check(any(f"rank {r} (pid {seen['pid']}" in l and "is stopped (SIGSTOP or a debugger)" in l for l in j.ncclwatch_lines()),
          f"the caretaker said it:\n{j.err[-2000:]}")
    last = s["comms"][0]["last_enqueued"]
    for when, report in (("while stopped", seen["live"]), ("at the end", analyze_dir(j.dir)[1])):
        v = report["verdicts"][0]
        what = json.dumps(report["verdicts"], indent=1)[:3000]
        check(v["cause"] == "rank_stopped" and v["culprit_ranks"] == [r], f"{when}: rank {r} is stopped:\n{what}")
        check(sorted(v["waiting_ranks"]) == sorted({0, 1, 2, 3} - {r}), f"{when}: the others wait:\n{what}")
        where = v["culprit_stacks"][str(r)]
        check(where["state"] == "stopped" and "stopped (SIGSTOP or a debugger) since" in where["where"],
              f"{when}: where: {where['where']}")
        check(where["callsite_op"].startswith(f"AllReduce #{last}") and where["callsite"], f"{when}: its last call: {where}")
        check("OOM" not in where["where"] and "without a word" not in where["where"], f"{when}: no death story: {where['where']}")
    check("then killed while stopped" in where["where"], f"killed while stopped: {where['where']}")
    pm = j.first(r, "postmortem")["summary"]
    check(pm["stopped"]["seen_unix_ns"] == s["stopped"]["seen_unix_ns"] and "then killed while stopped" in pm["detail"],
          f"its postmortem keeps the stop: {pm['detail']} {pm.get('stopped')}")


@case
def stopped_rank_continued_is_no_verdict():
    seen = {}

    def stop_then_continue(p):
        stop_a_rank(p, seen)
        os.kill(seen["pid"], signal.SIGCONT)
    j = job(4, ["--iters", "400", "--jitter-ms", "20", "--seed", "7"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=60,
            after_start=stop_then_continue)
    check(j.rc == 0, f"the job recovered and finished: {j.rc}\n{j.err[-2000:]}")
    rc, report = analyze_dir(j.dir)
    what = json.dumps(report["verdicts"], indent=1)[:3000]
    check(rc == 0 and [v["cause"] for v in report["verdicts"]] == ["no_hang"], f"a stop that ended is no verdict:\n{what}")
    problems = json.dumps(report.get("problems", []))
    check(seen["stand_in_file"] not in problems, f"its stand-in and its own later dumps side by side: {problems}")

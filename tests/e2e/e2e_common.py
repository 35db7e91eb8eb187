"""What the end-to-end cases share: the build under test, the case registry, and how a job is
started and its dumps read."""
import glob
import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import (Failure, catches, check, child_pids, end_time_limit_when, launcher_of, node_dirs, read_text, temp_dir,
                               wait_for, wait_for_ranks)

BUILD = None  # the build directory under test; run_e2e.py sets it
CASES = {}
# Cases that measure time (how soon a stall is seen, who is slow, how long a stop takes): ctest
# runs them alone.
SERIAL = set()
# Cases that take long (seconds on a quiet machine): ctest starts them first (their COST), so that
# a fresh clone's run does not end on one of them alone.
SECONDS = {}


def built(*parts):
    """A path in the build under test."""
    return os.path.join(BUILD, *parts)


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def long_case(seconds):
    """A case that takes about `seconds` on a quiet machine: ctest starts it early."""
    def register(fn):
        SECONDS[fn.__name__] = seconds
        return case(fn)
    return register


def serial_case(fn):
    """A case that measures time: ctest runs it alone."""
    SERIAL.add(fn.__name__)
    return case(fn)


def dumps_by_rank(directory):
    """The dumps in `directory` as {rank: [dump, ...]}, each ordered by dump_seq (its path in
    "_path")."""
    by_rank = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank*.json"))):
        with open(path) as f:
            d = json.load(f)
        d["_path"] = path
        by_rank.setdefault(d["summary"]["rank"], []).append(d)
    for v in by_rank.values():
        v.sort(key=lambda d: d["summary"]["dump_seq"])
    return by_rank


class Job:
    def __init__(self, rc, out, err, tmp):
        self.rc, self.out, self.err, self.tmp = rc, out, err, tmp
        self.dir = os.path.join(tmp, "dumps")

    def dumps(self):
        """{rank: [dump, ...]} ordered by dump_seq."""
        return dumps_by_rank(self.dir)

    def reasons(self, rank):
        return [d["summary"]["reason"] for d in self.dumps().get(rank, [])]

    def first(self, rank, reason):
        for d in self.dumps().get(rank, []):
            if d["summary"]["reason"] == reason:
                return d
        raise Failure(f"rank {rank} has no '{reason}' dump (has {self.reasons(rank)})\n{self.err[-3000:]}")

    def ncclwatch_lines(self):
        return [l for l in self.err.splitlines() if l.startswith("ncclwatch")]


def job(n, args, env=None, timeout=30, preload=True, program="sim_workload", cwd=None, after_start=None,
        launcher_args=(), until=None):
    """Runs the job under simlaunch; after_start(launcher) runs while it does. Its output goes to
    files (no pipe to fill while after_start waits). until(dumps): a condition on the dump
    directory (dumped(...)) after which the time limit ends at once, as it would end the job
    (a hung job waits it out otherwise)."""
    tmp = temp_dir("ncclwatch-e2e-")
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    for k in list(e):
        if k.startswith("NCCLWATCH_"):
            del e[k]
    e["NCCLWATCH_DIR"] = os.path.join(tmp, "dumps")
    e["NCCLWATCH_PEER_POLL_MS"] = "200"
    # Each case's black boxes apart: a case's host caretaker converts only its own job's dead.
    # Its request relay too: a job whose ranks are all killed leaves its relay's lock behind
    # (tidied by the host's next caretaker), and a case writes only in its temporary directory.
    e.update(node_dirs(tmp))
    if preload:
        e["LD_PRELOAD"] = built("lib", "libncclwatch.so")
    e.update(env or {})
    cmd = [built("bin", "simlaunch"), "-n", str(n), "--timeout", str(timeout)] + list(launcher_args) + \
          ["--", built("bin", program)] + args
    out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, env=e, cwd=cwd or tmp, stdout=out, stderr=err)
    if until:
        end_time_limit_when(launcher_of(p), until(e["NCCLWATCH_DIR"]))
    try:
        if after_start:
            after_start(p)
        p.wait(timeout=timeout + 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return Job(p.returncode, read_text(out_path), read_text(err_path), tmp)


def run_ended_when(cmd, env, cwd, ready, timeout=180):
    """subprocess.run(cmd, capture_output=True, text=True) for `ncclwatch run ... -- simlaunch ...`
    (its output in files of `cwd`), whose launcher's time limit ends at once (SIGUSR1: as the
    limit would end the job) when ready(stdout so far, stderr so far) holds."""
    n = 0
    while os.path.exists(os.path.join(cwd, f"run{n}.out")):
        n += 1
    out, err = os.path.join(cwd, f"run{n}.out"), os.path.join(cwd, f"run{n}.err")
    with open(out, "w") as o, open(err, "w") as e:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=o, stderr=e)

    def launcher():
        if p.poll() is not None:
            return None
        return next((c for c in child_pids(p.pid) if read_text(f"/proc/{c}/comm").strip() == "simlaunch"), 0)
    end_time_limit_when(launcher, lambda: ready(read_text(out), read_text(err)))
    try:
        p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return subprocess.CompletedProcess(cmd, p.returncode, read_text(out), read_text(err))


def ring_entries(d):
    """The ring's operations as objects, decoded from version 2's shapes and rows as
    docs/trace-format.md describes them (a second reader, independent of the C++ one)."""
    ring = d["ring"]
    if "entries" in ring:
        return ring["entries"]
    states = ["pending_launch", "enqueued", "gpu_reached", "completed", "error", "captured", "unmonitored", "unknown",
              "aborted"]
    at = {name: i for i, name in enumerate(ring["columns"])}
    slots, defined, enqueue, out = {}, 0, 0, []
    for row in ring["rows"]:
        if isinstance(row, dict):
            slots[defined % 4096] = {"shape": row, "seq": 0, "p2p_seq": 0, "group": 0}
            defined += 1
            continue
        get = lambda name: row[at[name]] if name in at and at[name] < len(row) else 0
        slot = slots[get("shape")]
        for name in ("seq", "p2p_seq", "group"):
            slot[name] += get(name)
        enqueue += get("enqueue_ns")
        op = dict(slot["shape"], seq=slot["seq"], p2p_seq=slot["p2p_seq"], group=slot["group"], enqueue_ns=enqueue,
                  gpu_reached_ns=enqueue + get("gpu_reached_minus_enqueue_ns"),
                  completed_ns=enqueue + get("completed_minus_enqueue_ns"),
                  state=states[get("state")] if 0 <= get("state") < len(states) else "unknown", result=get("result"))
        if isinstance(get("gpu_ms"), float):
            op["gpu_ms"] = get("gpu_ms")
        out.append(op)
    return out


def ranks_catching(p, n, *signals):
    """The pids of the job's n ranks once each has ncclwatch's handlers for `signals` (installed
    when its library starts): a signal sent then is ncclwatch's to handle."""
    names = "/".join(signal.Signals(s).name for s in signals)
    return wait_for_ranks(p, n, lambda pid: all(catches(pid, s) for s in signals), f"catching {names}")


def stalled(d):
    s = d["summary"]["stalled"]
    check(s is not None, f"{d['_path']}: summary.stalled is null")
    return s


def signal_app(scenario, preload, env=None):
    j = job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600", **(env or {})}, timeout=20, preload=preload,
            program="e2e_signal_app")
    ending = [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]
    return j, ending


def only_exit_records(j, what):
    """A healthy run: each rank's exit record, nothing else."""
    reasons = {r: j.reasons(r) for r in j.dumps()}
    check(all(v == ["exit"] for v in reasons.values()), f"{what}: exit records only: {reasons}")
    return [ds[0]["summary"] for ds in j.dumps().values()]


def analyze(j):
    r = subprocess.run([built("bin", "ncclwatch"), "analyze", "--json", j.dir], capture_output=True,
                       text=True)
    try:
        report = json.loads(r.stdout)
    except ValueError:
        raise Failure(f"analyze printed no JSON (exit {r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    text = subprocess.run([built("bin", "ncclwatch"), "analyze", "--no-color", j.dir], capture_output=True,
                          text=True).stdout
    return r.returncode, report, text


def analyze_dir(path, *extra):
    r = subprocess.run([built("bin", "ncclwatch"), "analyze", "--json", path] + list(extra),
                       capture_output=True, text=True)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        raise Failure(f"analyze printed no JSON (exit {r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")


def first_verdict(j, cause, culprits, seq=None):
    rc, report = analyze_dir(j.dir)
    v = report["verdicts"][0]
    what = json.dumps(report["verdicts"], indent=1)[:2500]
    check(rc == 1 and v["cause"] == cause and sorted(v["culprit_ranks"]) == culprits,
          f"{cause} {culprits} (exit {rc}):\n{what}\n{j.err[-1500:]}")
    if seq is not None:
        check(v["seq"] == seq, f"at #{seq}:\n{what}")
    return v


def rank_pid(p, rank):
    """The pid of the launcher's rank `rank` (from its environment)."""
    def find():
        for pid in child_pids(p.pid):
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in env:
                return pid
        return None
    return wait_for(find, f"rank {rank}'s process")


def host_dirs():
    # A host of its own for a case about what jobs leave on it: black box and relay directories
    # that no other case uses, and the settings that point a job at them (deadline 2 s).
    node = node_dirs(temp_dir("ncclwatch-e2e-host-"))
    return node["NCCLWATCH_BLACKBOX_DIR"], node["NCCLWATCH_RELAY_DIR"], dict(node, NCCLWATCH_TIMEOUT="2")


def kill_after_stall(p, rank):
    """After rank 0's stall dump, SIGKILLs `rank` (the OOM killer's way) and waits for its
    postmortem dump (its black box, converted by the host's caretaker)."""
    dumps = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps")
    pid = rank_pid(p, rank)
    wait_for(lambda: glob.glob(os.path.join(dumps, "rank00000-*-stall.json")), "rank 0's stall dump")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: glob.glob(os.path.join(dumps, f"rank{rank:05d}-*-postmortem.json")), f"rank {rank}'s postmortem dump")

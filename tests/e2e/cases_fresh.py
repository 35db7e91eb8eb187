"""Evidence that is fresh and the job's own: a dump answers the request it was asked for, one
job per directory, and what `run` says changes when the story does."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time

from e2e_common import (analyze_dir, built, case, long_case, host_dirs, job, ranks_catching, serial_case)
from ncclwatch_testing import (Failure, catches, check, child_pids, end_time_limit_when, read_text, temp_dir, wait_for,
                               wait_for_ranks)


def NW():
    """The ncclwatch command of the build under test."""
    return built("bin", "ncclwatch")


def run_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}


class RunJob:
    """`ncclwatch run [run_args] -- simlaunch -n N --timeout T -- sim_workload ARGS` in the
    background, its output in files."""

    def __init__(self, tmp, name, n, run_args, args, launcher_timeout, env=None):
        self.tmp, self.n = tmp, n
        self.out_path, self.err_path = os.path.join(tmp, name + ".out"), os.path.join(tmp, name + ".err")
        cmd = [NW(), "run"] + run_args + ["--", built("bin", "simlaunch"), "-n", str(n), "--timeout",
                                          str(launcher_timeout), "--", built("bin", "sim_workload")] + args
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.p = subprocess.Popen(cmd, env=dict(run_env(), **(env or {})), cwd=tmp, stdout=out, stderr=err)
        self.timeout = launcher_timeout

    def ranks(self, ready=lambda pid: catches(pid, signal.SIGTERM), what="catching SIGTERM"):
        """The ranks' pids once each is ready (the launcher is run's child)."""
        def launcher():
            kids = child_pids(self.p.pid)
            if self.p.poll() is not None:
                raise Failure(f"the run ended (exit {self.p.returncode}):\n{self.err()[-2000:]}")
            return kids and kids[0]
        pid = wait_for(launcher, "the launcher")

        class P:
            def poll(_):
                return self.p.poll()
        proxy = P()
        proxy.pid = pid
        return wait_for_ranks(proxy, self.n, ready, what)

    def end_when(self, ready):
        """The launcher's time limit ends (SIGUSR1) once ready() holds: as it would end the job."""
        def launcher():
            if self.p.poll() is not None:
                return None
            kids = child_pids(self.p.pid)
            return kids[0] if kids else 0
        end_time_limit_when(launcher, ready)

    def wait(self):
        try:
            self.p.wait(timeout=self.timeout + 90)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
        return self.p.returncode

    def out(self):
        return read_text(self.out_path)

    def err(self):
        return read_text(self.err_path)


def load_dumps(d):
    out = []
    for path in sorted(glob.glob(os.path.join(d, "rank*.json"))):
        with open(path) as f:
            x = json.load(f)
        x["_path"] = path
        out.append(x)
    return out


def mtime_ns(path):
    return os.stat(path).st_mtime_ns


@case
def fresh_dump_answers_every_hang():
    # A snapshot (`ncclwatch dump`) of a healthy job, then a hang seconds later (well inside the
    # 30 s a request used to count as fresh): every rank answers the hang's request with a dump
    # taken after it, and the verdicts (run's, live and final, and analyze's) name the hang's
    # operation, never the snapshot's.
    tmp = temp_dir("ncclwatch-e2e-fresh-")
    dumps, flag = os.path.join(tmp, "d"), os.path.join(tmp, "busy-now")
    j = RunJob(tmp, "run", 4, ["--dir", dumps, "--timeout", "3", "--set", "PEER_POLL_MS=200"],
               ["--iters", "100000000", "--jitter-ms", "2", "--busy-rank", "1", "--busy-after", flag, "--busy-ms", "-1"],
               launcher_timeout=60)
    j.ranks()
    snap = subprocess.run([NW(), "dump", dumps, "--json", "--wait", "30"], capture_output=True, text=True)
    check("4/4 ranks answered" in snap.stderr and json.loads(snap.stdout)["verdicts"][0]["cause"] == "no_hang",
          f"the snapshot: every rank answered, no hang:\n{snap.stderr[-1500:]}")
    snap_seq = max(c["last_enqueued"] for d in load_dumps(dumps) for c in d["summary"]["comms"])
    time.sleep(1.0)  # the job goes on past the snapshot's operations
    with open(flag, "w"):
        pass
    hang_at = mtime_ns(flag)
    # Until every rank has a dump of the hang: the stall's, or its answer to the stall's request.
    def hang_round():
        late = {}
        for d in load_dumps(dumps):
            s = d["summary"]
            if s["time_unix_ns"] > hang_at and s["reason"] in ("stall", "peer_request"):
                late.setdefault(s["rank"], []).append(d)
        return len(late) == 4 and late
    late = wait_for(hang_round, "a dump of every rank taken during the hang", timeout=60)
    answers = [d for d in late[1] if d["summary"]["reason"] == "peer_request"]
    check(answers and answers[0]["summary"]["trigger"]["reason"] == "stall",
          f"the busy rank answered the stall's request: {[d['summary'].get('trigger') for d in late[1]]}")
    wait_for(lambda: "while the job runs" in j.err(), "run's live verdict", timeout=60)
    # The live verdict describes the busy rank from its dump of the hang (busy outside NCCL),
    # never from the snapshot's, when it may have had an operation in flight.
    def live_rank1():
        first = j.out().split("ncclwatch analyze:")
        return len(first) > 1 and [l for l in first[1].splitlines() if l.strip().startswith("rank 1 (")]
    rank1 = wait_for(live_rank1, "rank 1's line in the live report on stdout", timeout=30)
    live = j.out().split("ncclwatch analyze:")[1]
    check(rank1 and "not inside NCCL" in rank1[0] and "not finished" not in rank1[0],
          f"the live verdict describes rank 1 as it is during the hang: {rank1[:1]}\n{live[-2500:]}")
    j.p.send_signal(signal.SIGTERM)  # run forwards it: the launcher and its ranks end
    j.wait()
    rc, report = analyze_dir(dumps)
    v = report["verdicts"][0]
    check(rc == 1 and v["cause"] == "rank_missing" and v["culprit_ranks"] == [1] and v["seq"] > snap_seq,
          f"analyze: rank 1 missing at the hang's operation (after #{snap_seq}):\n{json.dumps(report['verdicts'])[:2000]}")
    out = j.out()
    check(f"rank 1 never entered AllReduce #{v['seq']}" in out,
          f"run's verdict names the hang's operation #{v['seq']}:\n{out[-3000:]}\n{j.err()[-2000:]}")
    check(f"#{snap_seq} " not in out.split("ncclwatch analyze:")[1] if "ncclwatch analyze:" in out else True,
          "nothing from the snapshot's moment")
    # The class, in analyze: a rank whose latest dump answers an older request than the others'
    # latest did not answer that one; its older dump is not mixed in (rank 2's answers to the
    # hang's request and everything after are left out here).
    mixed = os.path.join(tmp, "mixed")
    os.makedirs(mixed)
    for d in load_dumps(dumps):
        s = d["summary"]
        if s["rank"] == 2 and s["time_unix_ns"] > hang_at:
            continue
        if s["reason"] in ("signal", "exit", "postmortem"):
            continue  # the moment of the hang, as a live analysis sees it
        shutil.copy(d["_path"], mixed)
    rc, report = analyze_dir(mixed)
    text = subprocess.run([NW(), "analyze", "--no-color", mixed], capture_output=True, text=True).stdout
    causes = [(x["cause"], x["culprit_ranks"], x["seq"]) for x in report["verdicts"]]
    check(all(seq > snap_seq or not seq for _, _, seq in causes),
          f"no verdict from rank 2's snapshot-time dump: {causes}\n{text[-2500:]}")
    check("rank 2 did not answer the latest dump request" in text, f"rank 2 did not answer, said so:\n{text[-2500:]}")


@case
def run_prints_the_changed_story():
    # run printed a verdict while the job ran (rank 1 busy at #51, a stall), the stall recovered
    # and a second hang came (rank 2's GPU never reaches #301): the new story is printed, said
    # to replace the one above, and the end does not say "no change" about the first one.
    tmp = temp_dir("ncclwatch-e2e-changed-")
    j = RunJob(tmp, "run", 4, ["--dir", os.path.join(tmp, "d"), "--timeout", "2", "--set", "PEER_POLL_MS=200"],
               ["--iters", "100000000", "--jitter-ms", "2", "--busy-rank", "1", "--busy-at", "50", "--busy-ms", "7000",
                "--slow-kernel-rank", "2", "--slow-kernel-at", "300", "--slow-kernel-ms", "-1"], launcher_timeout=30)
    j.end_when(lambda: "this report replaces the one above" in j.err() and "AllReduce #301" in j.out())
    j.wait()
    out, err = j.out(), j.err()
    check("rank 1 never entered AllReduce #51" in out, f"the first story:\n{out[-3000:]}\n{err[-2000:]}")
    check("AllReduce #301" in out and "gpu_not_reached" in out, f"the second story:\n{out[-3000:]}\n{err[-2000:]}")
    check("this report replaces the one above" in err, f"said to replace the first:\n{err[-2000:]}")
    final = out[out.rfind("ncclwatch analyze:"):]
    check("gpu_not_reached" in final and "#51" not in final.split("Also")[0].split("recovered")[0],
          f"the last report is the second story:\n{final[-2500:]}")


@case
def caretaker_says_only_its_jobs_deaths():
    # Job A's ranks are all SIGKILLed; job B, another job on the host, converts their black boxes
    # (into A's directory) but says nothing of A's deaths in its own output.
    boxes_dir, relay_dir, host = host_dirs()

    def kill_all(p):
        pids = wait_for_ranks(p, 2)
        wait_for(lambda: len(glob.glob(os.path.join(boxes_dir, "ncclwatch-box-*"))) == 2, "2 black boxes")
        time.sleep(0.5)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    first = job(2, ["--iters", "100000", "--jitter-ms", "5"], env=dict(host, NCCLWATCH_JOB_INSTANCE="job-a"),
                timeout=20, after_start=kill_all)
    time.sleep(5)  # its leftovers are old enough to be nobody's start-up
    second = job(2, ["--iters", "5", "--linger-ms", "1500"], env=dict(host, NCCLWATCH_JOB_INSTANCE="job-b"), timeout=15)
    check(second.rc == 0, f"the second job ran: {second.err[-1500:]}")
    check(all(first.reasons(r) == ["postmortem"] for r in range(2)),
          f"A's ranks were converted: {[first.reasons(r) for r in range(2)]}")
    check("ended without a word" not in second.err, f"B's output tells nothing of A's deaths:\n{second.err[-1500:]}")


@long_case(16)
def one_job_one_directory():
    # Two jobs into one --dir at once: a healthy one (B) and, started while B runs, one that
    # hangs (A). A warns at start that the directory holds a live job's files; B never answers
    # A's requests and reports no hang; A reports its own hang; analyze of the directory says
    # it holds two jobs and analyzes one.
    tmp = temp_dir("ncclwatch-e2e-twojobs-")
    shared = os.path.join(tmp, "d")
    b = RunJob(tmp, "b", 2, ["--dir", shared, "--timeout", "600", "--set", "PEER_POLL_MS=200"],
               ["--iters", "100000000", "--jitter-ms", "2"], launcher_timeout=90)
    b.ranks()
    snap = subprocess.run([NW(), "dump", shared, "--wait", "30", "--json"], capture_output=True, text=True)
    check("2/2 ranks answered" in snap.stderr, f"B's ranks answered a snapshot: {snap.stderr[-1000:]}")
    a = RunJob(tmp, "a", 2, ["--dir", shared, "--timeout", "3", "--set", "PEER_POLL_MS=200"],
               ["--iters", "100000000", "--jitter-ms", "2", "--busy-rank", "1", "--busy-at", "50", "--busy-ms", "-1"],
               launcher_timeout=14)
    a.end_when(lambda: "rank 1 never entered AllReduce" in a.out() and "while the job runs" in a.err())
    a.wait()
    b.p.send_signal(signal.SIGTERM)
    b.wait()
    check("holds files of another job that is still running" in a.err(), f"A warned at start:\n{a.err()[-1500:]}")
    check("rank 1 never entered AllReduce" in a.out(), f"A reports its hang:\n{a.out()[-2500:]}\n{a.err()[-1500:]}")
    bout = b.out() + b.err()
    check("never entered" not in bout and "rank_missing" not in bout, f"B reports no hang of A's:\n{bout[-3000:]}")
    check("0 stall(s)" in b.err() and "2 process(es) watched" in b.err(), f"B's own ranks only:\n{b.err()[-1500:]}")
    ds = load_dumps(shared)
    instances = {d["summary"]["job_instance"] for d in ds}
    check(len(instances) == 2 and all(i.startswith("run-") for i in instances), f"one instance per run: {instances}")
    stall_instance = {d["summary"]["job_instance"] for d in ds if d["summary"]["reason"] == "stall"}
    answered_stall = {d["summary"]["job_instance"] for d in ds
                      if (d["summary"].get("trigger") or {}).get("reason") == "stall"}
    check(len(stall_instance) == 1 and answered_stall <= stall_instance,
          f"only A's ranks answered A's request: stalls {stall_instance}, answers {answered_stall}")
    rc, report = analyze_dir(shared)
    check(any("2 jobs in this directory" in n for n in report["notes"]), f"analyze says so: {report['notes']}")
    picked = {report["verdicts"][0]["cause"]}
    rc2, other = analyze_dir(shared, "--attempt", "1" if report["attempt"] == 2 else "2")
    picked.add(other["verdicts"][0]["cause"])
    check(picked == {"rank_missing", "no_hang"}, f"each job apart: {picked}")


@case
def run_checks_its_directory():
    tmp = temp_dir("ncclwatch-e2e-rundir-")
    marker = os.path.join(tmp, "ran")
    a_file = os.path.join(tmp, "file")
    open(a_file, "w").close()
    for bad, why in (("/proc/ncclwatch-nope", ""), (os.path.join(tmp, "x" * 300), "File name too long"),
                     (os.path.join(a_file, "sub"), "Not a directory")):
        r = subprocess.run([NW(), "run", "--dir", bad, "--", "touch", marker], env=run_env(), cwd=tmp,
                           capture_output=True, text=True)
        check(r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot write the dump directory" in r.stderr and
              why in r.stderr and not os.path.exists(marker),
              f"--dir {bad[:60]}: refused before starting, in one line: {r.returncode} {r.stderr}")
    # A directory that becomes unusable after the start: the ranks fall back (one line each says
    # where), and run follows them there and gives the verdict.
    dumps, flag = os.path.join(tmp, "d"), os.path.join(tmp, "busy-now")
    j = RunJob(tmp, "run", 2, ["--dir", dumps, "--timeout", "3", "--set", "PEER_POLL_MS=200"],
               ["--iters", "100000000", "--jitter-ms", "2", "--busy-rank", "1", "--busy-after", flag, "--busy-ms", "-1"],
               launcher_timeout=16)
    j.ranks()
    os.rmdir(dumps) if os.path.isdir(dumps) else None
    open(dumps, "w").close()  # a file where the directory was
    open(flag, "w").close()
    j.end_when(lambda: "rank 1 never entered AllReduce" in j.out() and "while the job runs" in j.err())
    j.wait()
    err, out = j.err(), j.out()
    said = [l for l in err.splitlines() if "cannot write dump directory" in l and "instead" in l]
    check(said, f"a rank said where it writes instead:\n{err[-2000:]}")
    check("watching it there" in err, f"run followed the dumps:\n{err[-2000:]}")
    check("rank 1 never entered AllReduce" in out, f"and gave the verdict:\n{out[-2000:]}\n{err[-1500:]}")
    check("LD_PRELOAD cleared" not in err, f"no blame on the preload:\n{err[-1500:]}")


@serial_case
def early_dump_names_what_is_not_yet_due():
    # `ncclwatch dump` of a job whose rank 2 has been busy for 3 s, before the 15 s deadline: no
    # verdict yet, but the report names the wait; a healthy job's snapshot stays "no hang".
    flag_dir = temp_dir("ncclwatch-e2e-early-")
    flag = os.path.join(flag_dir, "busy-now")
    got = {}

    def snapshots(p):
        ranks_catching(p, 4, signal.SIGTERM)
        dumpdir = got["dir"]
        got["healthy"] = subprocess.run([NW(), "dump", dumpdir, "--json", "--wait", "30"], capture_output=True, text=True)
        with open(flag, "w"):
            pass
        time.sleep(3.0)
        got["early"] = subprocess.run([NW(), "dump", dumpdir, "--json", "--wait", "30"], capture_output=True, text=True)
        got["text"] = subprocess.run([NW(), "analyze", "--no-color", dumpdir], capture_output=True, text=True).stdout
        p.send_signal(signal.SIGUSR1)  # all taken: the job's time limit, now

    tmp = temp_dir("ncclwatch-e2e-early-")
    got["dir"] = os.path.join(tmp, "dumps")
    job(4, ["--iters", "100000000", "--jitter-ms", "2", "--busy-rank", "2", "--busy-after", flag, "--busy-ms", "-1"],
        env={"NCCLWATCH_DIR": got["dir"], "NCCLWATCH_TIMEOUT": "15"}, timeout=30, after_start=snapshots)
    healthy = json.loads(got["healthy"].stdout)["verdicts"][0]
    check(healthy["cause"] == "no_hang" and healthy["not_yet"] == [], f"healthy: no hang, nothing pending: {healthy}")
    r = got["early"]
    early = json.loads(r.stdout)
    v = early["verdicts"][0]
    check(r.returncode == 0 and v["cause"] == "no_hang", f"no verdict before the deadline: {r.returncode} {v['cause']}")
    ny = v["not_yet"]
    check(ny and ny[0]["culprit_ranks"] == [2] and ny[0]["op"] == "AllReduce" and ny[0]["waited_s"] >= 2.0 and
          ny[0]["deadline_s"] and 2.0 < ny[0]["deadline_s"] <= 15, f"the wait is named, with its deadline: {ny}")
    deadline = "%.1f s" % ny[0]["deadline_s"]  # 15 s, or the adaptive one below it
    text = got["text"]
    check(re.search(r"rank 2 has not entered AllReduce #\d+ for \d+\.\d s .*the deadline is " + re.escape(deadline), text) and
          "slightly different moments" not in text, f"said so, not 'stopped while healthy':\n{text[-2500:]}")


@long_case(13)
def small_messages_say_what_is():
    tmp = temp_dir("ncclwatch-e2e-msgs-")
    # A command that cannot start: that, and no guess about NCCL.
    r = subprocess.run([NW(), "run", "--dir", os.path.join(tmp, "d"), "--", "/no/such/prog"], env=run_env(), cwd=tmp,
                       capture_output=True, text=True)
    check(r.returncode == 127 and "cannot run '/no/such/prog'" in r.stderr and "NCCL" not in r.stderr and
          r.stderr.count("\n") == 1, f"one line, the program could not start: {r.returncode} {r.stderr}")
    check(not os.path.exists(os.path.join(tmp, "d")), "no directory left for a job that never ran")
    # A snapshot of a directory nobody uses leaves nothing, its parents included.
    r = subprocess.run([NW(), "dump", "does/not/exist", "--wait", "1"], cwd=tmp, capture_output=True, text=True)
    check(r.returncode == 2 and not os.path.exists(os.path.join(tmp, "does")), f"nothing left: {os.listdir(tmp)}")
    check("30 s" not in r.stderr, f"no 30 s promise: {r.stderr}")
    r = subprocess.run([NW(), "dump", "--help"], capture_output=True, text=True)
    check("30 s" not in r.stdout and "every new request" in r.stdout, f"dump --help: {r.stdout}")
    # Misspellings and unknown words.
    r = subprocess.run([NW(), "run", "--set", "TIMOUT=5", "--", "true"], env=run_env(), cwd=tmp, capture_output=True,
                       text=True)
    check(r.returncode == 2 and "did you mean NCCLWATCH_TIMEOUT?" in r.stderr, f"--set TIMOUT: {r.stderr}")
    r = subprocess.run([NW(), "help", "foo"], capture_output=True, text=True)
    check(r.returncode == 2 and "unknown subcommand 'foo'" in r.stderr, f"help foo: {r.returncode} {r.stderr[:300]}")
    r = subprocess.run([NW(), "--help"], capture_output=True, text=True)
    check("README" in r.stdout, f"--help points to what the wheel carries too: {r.stdout}")
    # A hang stopped long after its stall: the wait as of the newest evidence, and a rank whose
    # every dump is unreadable is said unreadable, not dead.
    j = job(4, ["--iters", "20", "--busy-rank", "2", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=12)
    rc, report = analyze_dir(j.dir)
    v = report["verdicts"][0]
    check(v["cause"] == "rank_missing" and v["waited_s"] >= 6.0,
          f"waited as of the SIGTERM dumps (~10 s in), not the stall's 2 s: {v['cause']} {v['waited_s']}")
    for path in glob.glob(os.path.join(j.dir, "rank00002-*.json")):
        with open(path, "w") as f:
            f.write("{\"truncated")
    text = subprocess.run([NW(), "analyze", "--no-color", j.dir], capture_output=True, text=True).stdout
    check("unreadable" in text and "likely killed" not in text and "is dead" not in text,
          f"rank 2's dumps are unreadable, nothing says it died:\n{text[-2500:]}")
    # No source line where addr2line has none (startup code without line info).
    text = subprocess.run([NW(), "analyze", "--no-color", "--verbose", j.dir], capture_output=True, text=True).stdout
    bad = [l for l in text.splitlines() if "_start" in l and "sim_workload.c" in l]
    check(not bad, f"_start has no line of sim_workload.c: {bad}")

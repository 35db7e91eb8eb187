"""`ncclwatch analyze` on the dumps of real jobs: every cause with its culprits and sequence
number, stragglers, and the verdict of each way a job ends."""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import time

from e2e_common import (analyze, analyze_dir, built, case, first_verdict, job, long_case, rank_pid, ranks_catching,
                        serial_case, stalled)
from ncclwatch_testing import (all_of, blocked_in_syscall, check, dumped, temp_dir, wait_for, wait_for_ranks)


def run_busy_then_on(n, busy_rank, workload_args, run_args=()):
    """`ncclwatch run` (deadline 2 s) of `n` ranks of 30 iterations, rank `busy_rank` busy 6 s
    at iteration 10, then on: a stall that recovers. Returns (the run, its directory, the dumps'
    directory)."""
    tmp = temp_dir("ncclwatch-e2e-")
    dumps = os.path.join(tmp, "d")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    r = subprocess.run([built("bin", "ncclwatch"), "run", "--dir", dumps, "--timeout", "2", "--set", "PEER_POLL_MS=200",
                        *run_args, "--", built("bin", "simlaunch"), "-n", str(n), "--timeout", "60", "--",
                        built("bin", "sim_workload"), "--iters", "30", *workload_args, "--busy-rank", str(busy_rank),
                        "--busy-at", "10", "--busy-ms", "6000"], env=base, cwd=tmp, capture_output=True, text=True,
                       timeout=120)
    return r, tmp, dumps


@serial_case
def recovered_stall_is_no_hang():
    # Rank 1 is busy 6 s at iteration 10, the deadline is 2 s: rank 0 stalls, rank 1 answers
    # its request, then the collective completes (a recovery dump) and the job finishes. No
    # verdict after the recovery, none at the end; the end tells the stall and whom it waited for.
    nw = built("bin", "ncclwatch")
    r, tmp, dumps = run_busy_then_on(2, 1, [])
    out = r.stdout + r.stderr
    check(r.returncode == 0, f"the job finished: {r.returncode}\n{out[-3000:]}")
    names = [os.path.basename(p) for p in glob.glob(os.path.join(dumps, "rank*.json"))]
    check(any(n.endswith("-recovery.json") for n in names), f"rank 0 recovered: {names}")
    # A verdict may come while the stall lasts; none after the recovery (at most that one).
    check(r.stdout.count("rank_missing") <= 1, f"no verdict after the recovery:\n{out[-4000:]}")
    final = r.stdout[r.stdout.rfind("ncclwatch analyze:"):]
    check("no hang" in final, f"the end reads no hang:\n{out[-4000:]}")
    check("stall_recovered" in final and "waiting for rank 1" in final and "it recovered" in final,
          f"the end tells the stall:\n{final[-3000:]}")
    check("(1 recovered)" in r.stderr, f"the summary line counts it recovered:\n{r.stderr[-1500:]}")
    # analyze says the same, on every dump and on the stall's moment and the recovery alone.
    for keep in (lambda n: True, lambda n: not n.endswith("-exit.json")):
        d = os.path.join(tmp, "only")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for n in names:
            if keep(n):
                shutil.copy(os.path.join(dumps, n), d)
        a = subprocess.run([nw, "analyze", "--json", d], capture_output=True, text=True)
        report = json.loads(a.stdout)
        check(a.returncode == 0 and report["verdicts"][0]["cause"] == "no_hang",
              f"analyze: no hang ({a.returncode}):\n{json.dumps(report['verdicts'])[:2000]}")
        rs = report["recovered_stalls"]
        check(len(rs) == 1 and rs[0]["waiting_for"] == [1] and rs[0]["op"] == "AllReduce",
              f"the stalled collective and whom it waited for: {rs}")
        check(rs[0]["recovered_after_s"] is not None and 4.0 <= rs[0]["recovered_after_s"] <= 15.0,
              f"and how long it took: {rs}")


@long_case(14)
def recovered_stall_names_the_busy_rank_whoever_asked():
    # 4 ranks, rank 0 busy 6 s at iteration 10: ranks 1-3 stall, whichever got stuck first
    # writes the job-wide request, rank 0 answers it and then goes on. Rank 1 straggles 250 ms
    # at every iteration, so it gets stuck after ranks 2 and 3: the request rank 0 answers is not
    # the lowest stalled rank's. The finding says the stall waited for rank 0, busy, from its
    # answer: never dead, never "left no dump".
    nw = built("bin", "ncclwatch")
    r, tmp, dumps = run_busy_then_on(4, 0, ["--jitter-ms", "3", "--straggler-rank", "1", "--straggler-ms", "250"],
                                     ["--no-analyze"])
    check(r.returncode == 0, f"the job finished: {r.returncode}\n{r.stderr[-3000:]}")
    a = subprocess.run([nw, "analyze", "--json", dumps], capture_output=True, text=True)
    report = json.loads(a.stdout)
    rs = report["recovered_stalls"]
    check(rs and all(x["waiting_for"] == [0] and x["cause"] == "rank_missing" for x in rs),
          f"every recovered stall waited for rank 0, busy: {json.dumps(rs)[:2000]}")
    asked = [(json.load(open(os.path.join(dumps, f))).get("summary", {}).get("answered") or {}).get("origin_rank")
             for f in os.listdir(dumps) if f.startswith("rank00000-") and f.endswith("-peer_request.json")]
    check(asked and 1 not in asked, f"rank 0 answered a request of rank 2 or 3, not of rank 1: {asked}")
    text = subprocess.run([nw, "analyze", "--no-color", dumps], capture_output=True, text=True).stdout
    check("left no dump" not in text and "rank_dead" not in text, f"rank 0 is never dead or without a dump:\n{text[-3000:]}")


def expect_verdict(j, cause, culprits, seq=None, op=None):
    rc, report, text = analyze(j)
    check(rc == (0 if cause == "no_hang" else 1), f"exit status {rc} for {cause}")
    v = report["verdicts"][0]
    summary = json.dumps(report["verdicts"], indent=1)[:3000]
    check(v["cause"] == cause, f"first verdict is {cause}:\n{summary}")
    check(sorted(v["culprit_ranks"]) == sorted(culprits), f"culprits {culprits}:\n{summary}")
    if seq is not None:
        check(v["seq"] == seq, f"sequence number {seq}:\n{summary}")
    if op is not None:
        check(v["op"] == op, f"operation {op}:\n{summary}")
    check(cause in text or cause.replace("_", " ") in text, "the text report names the cause")
    print(f"  {cause}: culprits {v['culprit_ranks']} seq {v['seq']} op {v['op']}")
    return v, text


STALL = {"NCCLWATCH_TIMEOUT": "3"}


def findings(j):
    r = subprocess.run([built("bin", "ncclwatch"), "analyze", j.dir, "--json"], capture_output=True, text=True)
    check(r.returncode in (0, 1), f"analyze ran: {r.returncode} {r.stderr[-1500:]}")
    report = json.loads(r.stdout)
    return report, report["findings"]


@serial_case
def slow_rank_named():
    # One rank of 8 sleeps 20-50 ms before every collective: the others wait for it each time.
    j = job(8, ["--iters", "60", "--straggler-rank", "3", "--straggler-ms", "20", "--straggler-max-ms", "50"],
            timeout=60)
    check(j.rc == 0, f"the job finished: {j.rc}\n{j.err[-1500:]}")
    report, found = findings(j)
    check(report["verdicts"][0]["cause"] == "no_hang", "a straggler is not a hang")
    check([f["rank"] for f in found] == [3], f"rank 3 and only rank 3 is named: {found}")
    f = found[0]
    check(f["kind"] == "slow_rank" and f["last_in"] >= 0.9 * f["collectives"] and f["collectives"] >= 40,
          f"last at nearly every collective: {f}")
    check(18 <= f["lateness_median_ms"] <= 60 and f["lateness_p90_ms"] >= f["lateness_median_ms"], f"its lateness: {f}")
    check(any(fr.get("function", "").startswith("main") for fr in f["callsite"]), f"its call site: {f['callsite']}")
    text = subprocess.run([built("bin", "ncclwatch"), "analyze", j.dir, "--no-color"], capture_output=True,
                          text=True)
    check(text.returncode == 0, "a finding does not change the exit status")
    check("slow_rank  rank 3" in text.stdout and "Also noticed" in text.stdout, text.stdout)


@serial_case
def healthy_jitter_names_nobody():
    # Jitter alone names nobody. On a loaded machine a rank can really be late at most
    # collectives: the scheduler kept its thread off a CPU (2 cores, 8 ranks, other work). That
    # finding is right (the rank was slow, whatever the reason), so it is allowed when the named
    # rank's issuing thread waited for a CPU, over the loop, clearly more than the others did:
    # its extra wait explains at least half its median lateness.
    for seed in range(1, 7):
        n = 8 if seed % 2 else 2
        iters = 50
        j = job(n, ["--iters", str(iters), "--jitter-ms", "10", "--seed", str(seed), "--cpu-wait"], timeout=60)
        check(j.rc == 0, f"seed {seed}: the job finished")
        _, found = findings(j)
        waits = {int(m.group(1)): float(m.group(2)) / iters
                 for m in re.finditer(r"cpu wait: rank (\d+) ([\d.]+) ms", j.out)}
        for f in found:
            others = sorted(w for r, w in waits.items() if r != f["rank"])
            extra = waits.get(f["rank"], 0) - (others[len(others) // 2] if others else 0)
            check(extra >= f["lateness_median_ms"] / 2,
                  f"seed {seed}, {n} ranks: jitter alone names nobody, unless the machine kept the named rank off "
                  f"a CPU: {extra:.1f} ms more CPU wait per iteration than the others' median, lateness "
                  f"{f['lateness_median_ms']:.1f} ms (CPU wait per iteration by rank: {waits}): {found}")


@serial_case
def slow_rank_below_a_hang():
    j = job(8, ["--iters", "200", "--straggler-rank", "2", "--straggler-ms", "20", "--straggler-max-ms", "40",
                "--busy-rank", "5", "--busy-at", "40", "--busy-ms", "-1"], env={"NCCLWATCH_TIMEOUT": "3"}, timeout=12,
            until=lambda d: dumped(d, range(8)))
    report, found = findings(j)
    v = report["verdicts"][0]
    check(v["cause"] == "rank_missing" and v["culprit_ranks"] == [5], f"the hang leads: {v['cause']} {v['culprit_ranks']}")
    check([f["rank"] for f in found] == [2], f"the straggler is a finding below it: {found}")
    r = subprocess.run([built("bin", "ncclwatch"), "analyze", j.dir, "--no-color"], capture_output=True, text=True)
    check(r.returncode == 1, "the exit status is the hang's")
    check(r.stdout.index("rank_missing") < r.stdout.index("slow_rank"), "verdicts first, findings after")


@case
def analyze_rank_missing():
    j = job(4, ["--iters", "20", "--busy-rank", "2", "--busy-at", "5", "--busy-ms", "-1"], env=STALL, timeout=9,
            until=lambda d: dumped(d, range(4)))
    v, text = expect_verdict(j, "rank_missing", [2], seq=6, op="AllReduce")
    check(sorted(v["waiting_ranks"]) == [0, 1, 3], f"waiting ranks: {v['waiting_ranks']}")
    where = json.dumps(v["culprit_stacks"]["2"])
    check("main" in where, f"the culprit's current stack is shown: {where[:500]}")


@case
def analyze_gpu_not_reached():
    j = job(4, ["--iters", "20", "--slow-kernel-rank", "1", "--slow-kernel-at", "5", "--slow-kernel-ms", "-1"],
            env=STALL, timeout=9, until=lambda d: dumped(d, range(4)))
    expect_verdict(j, "gpu_not_reached", [1], seq=6, op="AllReduce")


@case
def analyze_stuck_in_collective():
    j = job(4, ["--iters", "20"], env=dict(STALL, NCCLWATCH_SIM_FAULT="stall:rank=1,seq=4"), timeout=9,
            until=lambda d: dumped(d, range(4)))
    v, text = expect_verdict(j, "stuck_in_collective", [], seq=4)
    check(sorted(v["waiting_ranks"]) == [0, 1, 2, 3], f"everyone waits: {v['waiting_ranks']}")


@case
def analyze_mismatch():
    j = job(4, ["--iters", "20", "--mismatch-rank", "3", "--mismatch-at", "5"], env=STALL, timeout=9)
    expect_verdict(j, "mismatch", [3], seq=6)


@case
def analyze_call_count_divergence():
    j = job(4, ["--iters", "20", "--extra-rank", "1", "--extra-at", "5"], env=STALL, timeout=9)
    v, text = expect_verdict(j, "mismatch", [1], seq=6)
    check(v.get("call_count_divergence") is True, f"named a call-count divergence: {v.get('advice')}")


@case
def analyze_p2p_unmatched():
    # Both send first, then receive, on one stream: each issued the receive the other's send
    # waits for, queued behind its own send: out of order (issue 45), not unmatched.
    j = job(2, ["--iters", "4", "--p2p-deadlock"], env=STALL, timeout=8)
    v, text = expect_verdict(j, "p2p_out_of_order", [0, 1])
    check(v.get("cycle") in ([0, 1, 0], [1, 0, 1]), f"the deadlock cycle is shown: {v.get('cycle')}")


@case
def analyze_cross_comm_deadlock():
    j = job(4, ["--iters", "4", "--cross-comm-deadlock"], env=STALL, timeout=9)
    v, text = expect_verdict(j, "cross_comm_deadlock", v_culprits(j))
    check(v.get("cycle"), f"the wait cycle is shown: {v}")


def v_culprits(j):
    # Which ranks a cross-communicator cycle names depends on where it is entered; take them from
    # the report and check they are all ranks of the job.
    rc, report, _ = analyze(j)
    c = report["verdicts"][0]["culprit_ranks"]
    check(c and set(c) <= {0, 1, 2, 3}, f"culprits are ranks of the job: {c}")
    return c


@case
def analyze_rank_dead():
    j = job(4, ["--iters", "20"], env=dict(STALL, NCCLWATCH_SIM_FAULT="crash:rank=2,seq=5"), timeout=9)
    check(j.reasons(2) == ["postmortem"], f"the killed rank's only dump is the one the host wrote for it: {j.reasons(2)}")
    expect_verdict(j, "rank_dead", [2])


@case
def analyze_no_hang():
    def poke(p):
        ranks_catching(p, 2, signal.SIGUSR2)
        # Lingering: the main thread sleeps (clock_nanosleep; a collective waits on a futex).
        for pid in wait_for_ranks(p, 2, lambda pid: blocked_in_syscall(pid, 230), "idle after their last iteration"):
            os.kill(pid, signal.SIGUSR2)
    # Dumps taken while every rank idles after its last iteration: nothing is stuck.
    j = job(2, ["--iters", "10", "--linger-ms", "2500"], timeout=20, after_start=poke)
    check(j.rc == 0, "the job finished")
    check(sorted(j.dumps()) == [0, 1], "both ranks dumped on demand")
    expect_verdict(j, "no_hang", [])


def json_schema(value, path="", out=None, free=("process.env",)):
    """{path: {json type}} over a document; arrays merge their elements ([]), objects whose keys
    are data (the environment) merge theirs (*)."""
    out = {} if out is None else out
    t = ("null" if value is None else "bool" if isinstance(value, bool) else "int" if isinstance(value, int)
         else "float" if isinstance(value, float) else "string" if isinstance(value, str)
         else "array" if isinstance(value, list) else "object")
    out.setdefault(path, set()).add(t)
    if isinstance(value, dict):
        for k, v in value.items():
            json_schema(v, f"{path}.{'*' if path in free else k}".lstrip("."), out, free)
    elif isinstance(value, list):
        for v in value:
            json_schema(v, path + "[]", out, free)
    return out


def schema_differences(a, b, optional=("gpu_ms",)):
    """Paths whose non-null types differ, and keys one side has where the other side wrote the
    same parent with content (a parent that is null or an empty array on one side was not
    exercised there)."""
    problems = []

    def exercised(schema, path):
        if path.endswith("[]"):
            return False  # the other side's array was always empty: its elements were not written
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        return "object" in schema.get(parent, set())

    for path in sorted(set(a) | set(b)):
        ta, tb = a.get(path, set()) - {"null"}, b.get(path, set()) - {"null"}
        if path.rsplit(".", 1)[-1] in optional:
            continue
        if ta and tb and ta != tb:
            problems.append(f"{path}: {sorted(ta)} vs {sorted(tb)}")
        elif path not in b and ta and exercised(b, path):
            problems.append(f"{path}: only in the library's dumps")
        elif path not in a and tb and exercised(a, path):
            problems.append(f"{path}: only in the generated dumps")
    return problems


@case
def generated_dump_matches_library_dump():
    # The same scenarios written by the library over the simulator and by ncclwatch-gen (the
    # test generator) must have the same keys with the same JSON types: one format, one writer.
    real = []
    for args, env, until in ((["--iters", "20", "--slow-kernel-rank", "2", "--slow-kernel-at", "5", "--slow-kernel-ms", "-1"],
                              {"NCCLWATCH_TIMEOUT": "3"}, lambda d: dumped(d, range(4))),  # a hang: ended once all dumped
                             (["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "6000"],
                              {"NCCLWATCH_TIMEOUT": "2"}, None)):
        j = job(4, args, env=env, timeout=14, until=until)
        real += [d for ds in j.dumps().values() for d in ds]
    reasons = {d["summary"]["reason"] for d in real}
    check({"stall", "peer_request"} <= reasons, f"library dumps for a stall and a peer request: {reasons}")
    generated = []
    for scenario in ("gpu_not_reached", "rank_missing"):
        out = temp_dir("ncclwatch-gen-")
        r = subprocess.run([built("bin", "ncclwatch-gen"), "--ranks", "4", "--ring", "64", "--scenario",
                            scenario, "--out", out], capture_output=True, text=True)
        check(r.returncode == 0, f"ncclwatch-gen {scenario}: {r.stderr}")
        for path in glob.glob(os.path.join(out, "rank*.json")):
            with open(path) as f:
                generated.append(json.load(f))
    lib_schema, gen_schema = {}, {}
    for d in real:
        d.pop("_path", None)
        json_schema(d, out=lib_schema)
    for d in generated:
        json_schema(d, out=gen_schema)
    diff = schema_differences(lib_schema, gen_schema)
    check(not diff, "library and generated dumps differ:\n  " + "\n  ".join(diff))
    compared = [p for p in lib_schema if p in gen_schema]
    check(len(compared) > 100, f"most of the format compared ({len(compared)} paths)")
    print(f"  {len(compared)} paths compared, {len(real)} library dumps, {len(generated)} generated")


@case
def ending_stopped_healthy_is_no_hang():
    # Slurm's time limit / Ctrl-C: SIGTERM to every rank of a healthy job mid-run. The ranks dump
    # moments apart, at different sequence numbers: not a hang, exit status 0.
    j = job(4, ["--iters", "1000000"], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=4)
    reasons = {d["summary"]["reason"] for ds in j.dumps().values() for d in ds}
    check("signal" in reasons, f"the ranks dumped on SIGTERM: {reasons}\n{j.err[-2000:]}")
    rc, report = analyze_dir(j.dir)
    check(rc == 0 and report["verdicts"][0]["cause"] == "no_hang",
          f"no_hang with exit 0 (exit {rc}):\n{json.dumps(report['verdicts'], indent=1)[:2000]}")


@case
def ending_framework_abort_first():
    # The framework's watchdog (2 s) aborts before ncclwatch's deadline (600 s): the waiting ranks
    # abort their communicators and exit; rank 0, busy in a "checkpoint", answers the job-wide
    # request the abort wrote. The first verdict names rank 0, not the aborting ranks.
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1", "--abort-after-ms", "2000"],
            env={"NCCLWATCH_TIMEOUT": "600"}, timeout=10,
            until=lambda d: all_of(dumped(d, [1, 2, 3], ["abort"]), dumped(d, [0], ["peer_request"])))
    for r in (1, 2, 3):
        check("abort" in j.reasons(r), f"rank {r} dumped on abort: {j.reasons(r)}")
    rc, report = analyze_dir(j.dir)
    v = report["verdicts"][0]
    check(rc == 1 and v["cause"] == "rank_missing" and v["culprit_ranks"] == [0] and v["seq"] == 6,
          f"rank_missing rank 0 at #6:\n{json.dumps(report['verdicts'], indent=1)[:2500]}")


@case
def ending_reused_directory():
    # Two attempts into one directory: a hang (rank 3 busy), then a healthy run stopped by
    # SIGTERM. The latest attempt is analyzed and said to be one of two; --attempt 1 gives the
    # hang of the first.
    shared = temp_dir("ncclwatch-e2e-reused-")
    env = {"NCCLWATCH_DIR": shared, "NCCLWATCH_TIMEOUT": "2"}
    job(4, ["--iters", "20", "--busy-rank", "3", "--busy-at", "5", "--busy-ms", "-1"], env=env, timeout=8)
    # The second attempt starts after the first ended (job() returns then), as a restart does.
    # Its ranks pause a little between iterations: four ranks spinning flat out on a loaded
    # 2-core machine can starve their watchdogs past the launcher's grace before SIGKILL.
    job(4, ["--iters", "1000000", "--jitter-ms", "2"], env=dict(env, NCCLWATCH_TIMEOUT="600"), timeout=4)
    rc, latest = analyze_dir(shared)
    check(len(latest["attempts"]) == 2 and latest["attempt"] == 2, f"two attempts, the latest analyzed: {latest['attempts']}")
    check(rc == 0 and latest["verdicts"][0]["cause"] == "no_hang",
          f"the healthy latest attempt: exit {rc}\n{json.dumps(latest['verdicts'], indent=1)[:2000]}")
    check(any("2 attempts" in n for n in latest["notes"]), f"the report says so: {latest['notes']}")
    rc, first = analyze_dir(shared, "--attempt", "1")
    v = first["verdicts"][0]
    check(rc == 1 and v["cause"] == "rank_missing" and v["culprit_ranks"] == [3],
          f"--attempt 1: rank_missing rank 3:\n{json.dumps(first['verdicts'], indent=1)[:2000]}")


@case
def ending_rank_exits():
    # Uneven inputs: rank 2 leaves the loop before iteration 5 and exits normally; the others
    # wait in #6. Its exit record says where it stopped.
    j = job(4, ["--iters", "20", "--exit-rank", "2", "--exit-at", "5"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    d = j.first(2, "exit")
    check(d["summary"]["exit_status"] == 0, f"its exit status: {d['summary']['exit_status']}")
    v = first_verdict(j, "rank_exited", [2], seq=6)
    check("exited with status 0" in v["culprit_stacks"]["2"]["where"], f"where: {v['culprit_stacks']['2']}")


@case
def ending_nccl_error():
    # Rank 1's ncclAllReduce #5 returns ncclSystemError (its async error then says
    # ncclRemoteError); it prints it and exits 3; the others wait in #5.
    j = job(4, ["--iters", "20"], env={"NCCLWATCH_TIMEOUT": "2", "NCCLWATCH_SIM_FAULT": "error:rank=1,seq=5"},
            timeout=8)
    d = j.first(1, "nccl_error")
    f = d["summary"]["failed"]
    check(f and f["seq"] == 5 and f["state"] == "error" and f["result"] != 0, f"the failed call is in the dump: {f}")
    v = first_verdict(j, "nccl_error", [1], seq=5)
    s = v["culprit_stacks"]["1"]
    check("returned" in s["where"] and "AllReduce #5" in s["callsite_op"], f"the call, the error, its call site: {s}")


@case
def ending_setup_hang():
    # Rank 2 never calls ncclCommInitRank; the others block inside it and, past the deadline,
    # dump: the communicator is `initializing` and rank 2 never joined.
    j = job(4, ["--iters", "5", "--no-init-rank", "2"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    for r in (0, 1, 3):
        comms = j.first(r, "stall")["summary"]["comms"] if "stall" in j.reasons(r) else j.dumps()[r][0]["summary"]["comms"]
        check(any(c["state"] == "initializing" for c in comms), f"rank {r}: the communicator is initializing: {comms}")
        # One hang, one stall dump naming the communicator (not also a "thread blocked" one).
        stalls = [d["summary"]["detail"] for d in j.dumps()[r] if d["summary"]["reason"] == "stall"]
        check(len(stalls) == 1 and "on comm" in stalls[0], f"rank {r}: one stall dump for the setup hang: {stalls}")
    v = first_verdict(j, "init_hang", [2])
    check(sorted(v["waiting_ranks"]) == [0, 1, 3], f"waiting: {v['waiting_ranks']}")


@long_case(25)
def late_rank_then_healthy_is_no_hang():
    # A rank reaches setup (or its first collective) seconds after the others, past their
    # deadline, then the job runs healthily: the others' setup-time stall dumps are followed by
    # newer evidence of the same processes (a finished job's exit records, a healthy stop's
    # SIGTERM dumps). No hang; the late start is told as a recovered stall, waiting for the late rank.
    late_setup = ["--late-init-rank", "2", "--late-init-ms", "5000"]
    late_first = ["--busy-rank", "2", "--busy-at", "0", "--busy-ms", "5000"]
    for name, args, iters, timeout, op in (
            ("late setup, job finishes", late_setup, "300", 40, "ncclCommInitRankConfig"),
            ("late setup, job stopped while healthy", late_setup, "100000000", 12, "ncclCommInitRankConfig"),
            ("late first collective, job finishes", late_first, "300", 40, "AllReduce")):
        j = job(4, ["--iters", iters, "--sync-every", "1"] + args, env={"NCCLWATCH_TIMEOUT": "2"}, timeout=timeout)
        stalls = [r for r in (0, 1, 3) if "stall" in j.reasons(r)]
        check(stalls, f"{name}: the others reported the late start as a stall: {[j.reasons(r) for r in range(4)]}\n{j.err[-2000:]}")
        rc, report = analyze_dir(j.dir)
        v = report["verdicts"][0]
        check(rc == 0 and v["cause"] == "no_hang", f"{name}: no hang ({rc}): {json.dumps(report['verdicts'])[:1500]}")
        rs = report["recovered_stalls"]
        check(len(rs) == 1 and rs[0]["op"] == op and rs[0]["waiting_for"] == [2],
              f"{name}: one recovered stall, {op} waiting for rank 2: {json.dumps(rs)[:1500]}")


@long_case(15)
def mid_job_communicator_never_joined():
    # Before iteration 10 every rank creates a new communicator (a checkpoint group), except rank
    # 5, busy in host code. Each way of creating one: ncclCommInitRank / ncclCommInitRankConfig
    # per block of 4 ranks (ranks 0-3 create theirs and wait in the next world collective, 4, 6
    # and 7 wait inside the creation), ncclCommSplit and ncclCommShrink of the world (the seven
    # others all wait inside it). Only rank 5 is to blame, as the one that never joined; a blocked
    # creation is never no_hang.
    for kind, groups in (("init", "2"), ("config", "2"), ("split", "2"), ("shrink", "1")):
        j = job(8, ["--iters", "30", "--new-comm-at", "10", "--new-comm-kind", kind, "--new-comm-groups", groups,
                    "--new-comm-skip-rank", "5"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=10,
                until=lambda d: dumped(d, range(8)))
        rc, report = analyze_dir(j.dir)
        causes = [(v["cause"], v["culprit_ranks"]) for v in report["verdicts"]]
        check(rc == 1 and causes[0] == ("init_hang", [5]), f"{kind}: init_hang naming rank 5 first ({rc}): {causes}\n{j.err[-1500:]}")
        check(all(v["culprit_ranks"] in ([5], []) and v["cause"] != "no_hang" for v in report["verdicts"]),
              f"{kind}: no other rank blamed, never no_hang: {causes}")
        s = report["verdicts"][0]["culprit_stacks"].get("5", {})
        check("not inside NCCL" in s.get("where", "") and s.get("current"), f"{kind}: rank 5's place and stack: {s.get('where')}")


@case
def ending_framework_abort_then_sigabrt():
    # As PyTorch tears down: the waiting ranks abort their communicators, then abort() (SIGABRT:
    # a fatal_signal dump after the abort dump). The busy rank is still the culprit.
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1", "--abort-after-ms", "2000",
                "--abort-signal"], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=10,
            until=lambda d: all_of(dumped(d, [1, 2, 3], ["fatal_signal"]), dumped(d, [0], ["peer_request"])))
    # Under load a rank may answer another's request between the two (a peer_request): the abort
    # still leads and stays the evidence.
    for r in (1, 2, 3):
        own = [x for x in j.reasons(r) if x != "peer_request"]
        check(own[:2] == ["abort", "fatal_signal"], f"rank {r}: abort then SIGABRT: {j.reasons(r)}")
    v = first_verdict(j, "rank_missing", [0], seq=6)


@case
def ending_graph_then_missing():
    # An all-reduce captured into a CUDA graph and replayed, then plain all-reduces; rank 3 stops
    # before the third of them. The captured one is never "not reached": rank 3 is missing from
    # the next collective.
    j = job(4, ["--graph", "--graph-then-loop", "--iters", "5", "--busy-rank", "3", "--busy-at", "2", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8, until=lambda d: dumped(d, range(4)))
    v = first_verdict(j, "rank_missing", [3])
    check(v["seq"] > 1, f"not at the captured operation (#1): #{v['seq']}")


@long_case(14)
def recovered_only_when_completed():
    # A pipeline's later stages wait in Recvs (p2p operations: no collective sequence number).
    # Only an operation whose completion a later dump saw is a recovered stall: a stage that
    # stops for good leaves Recvs that never complete (the launcher's SIGTERM dumps show them
    # still pending), a stage that stops for a while leaves Recvs that complete.
    for name, stop, finishes in (("stopped for good", [], False), ("stopped 5 s", ["--stop-ms", "5000"], True)):
        j = job(4, ["--microbatches", "8", "--stop-rank", "1", "--stop-at", "3"] + stop, program="sim_pipeline",
                env={"NCCLWATCH_TIMEOUT": "2"}, timeout=30 if finishes else 8)
        stalled_ops = [stalled(j.first(r, "stall"))["op"] for r in (2, 3)]
        check(stalled_ops == ["Recv", "Recv"], f"{name}: stages 2 and 3 stalled in a Recv: {stalled_ops}\n{j.err[-1500:]}")
        rc, report = analyze_dir(j.dir)
        v, rs = report["verdicts"][0], report["recovered_stalls"]
        if finishes:
            check(rc == 0 and v["cause"] == "no_hang", f"{name}: no hang ({rc}): {json.dumps(report['verdicts'])[:1500]}")
            recvs = sorted(r["rank"] for r in rs if r["op"] == "Recv")
            check(recvs == [2, 3] and all(r["op"] in ("Send", "Recv") for r in rs),
                  f"{name}: the Recvs that completed (stages 2 and 3) are recovered stalls: {json.dumps(rs)[:1500]}")
        else:
            check(rc == 1 and v["culprit_ranks"] == [1], f"{name}: stage 1 is named ({rc}): {json.dumps(report['verdicts'])[:1500]}")
            check(rs == [], f"{name}: no operation that never completed is a recovered stall: {json.dumps(rs)[:1500]}")


def check_extra_call(n, final_from, iters=40):
    """Ranks below `final_from` finish the loop, destroy their communicator and exit 0; the others
    issue one more all-reduce (their final metrics) and wait. The story is that call: its ranks
    and their call site first, the ranks that ended normally named as such."""
    j = job(n, ["--iters", str(iters), "--final-from", str(final_from)], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    ended, extra = list(range(final_from)), list(range(final_from, n))
    for r in ended:
        check(j.reasons(r) == ["exit"] and j.first(r, "exit")["summary"]["exit_status"] == 0,
              f"rank {r} ended normally: {j.reasons(r)}")
    rc, report, text = analyze(j)
    what = json.dumps(report["verdicts"], indent=1)[:3000]
    check(rc == 1 and len(report["verdicts"]) == 1, f"one verdict, a hang ({rc}):\n{what}")
    v = report["verdicts"][0]
    check(v["cause"] == "extra_call" and v["culprit_ranks"] == extra and v["seq"] == iters + 1 and v["op"] == "AllReduce",
          f"extra_call: ranks {extra} issued AllReduce #{iters + 1}:\n{what}")
    check(v["ended_ranks"] == ended and v["ended_after_seq"] == iters, f"the ranks that ended, after #{iters}:\n{what}")
    first = v["culprit_stacks"][str(extra[0])]
    check(first["callsite_op"].startswith(f"AllReduce #{iters + 1} ") and
          any(f["function"].startswith("main") for f in first["callsite"]),
          f"rank {extra[0]}'s call site of the extra all-reduce: {json.dumps(first)[:2000]}")
    who = f"rank {extra[0]}" if len(extra) == 1 else f"ranks {extra[0]}, {extra[-1]}" if len(extra) == 2 else ""
    ended_text = f"rank {ended[0]}" if len(ended) == 1 else f"ranks {ended[0]}, {ended[-1]}" if len(ended) == 2 \
        else f"ranks {ended[0]}-{ended[-1]}"
    head = text.splitlines()[2] if len(text.splitlines()) > 2 else text
    check(head.startswith(f"1. extra_call  {who} issued AllReduce #{iters + 1} ") and
          f"{ended_text} completed #{iters} and ended normally" in head, f"the headline says it:\n{text[:3000]}")
    first_evidence = next((l for l in text.splitlines() if re.match(r"   \S*rank \d+ \(", l)), "")
    check(first_evidence.startswith(f"   rank {extra[0]} ("), f"its evidence comes first:\n{text[:3000]}")
    check(f"AllReduce #{iters + 1} on" in text and "was called from:" in text, f"with its call site:\n{text[:3000]}")


@case
def extra_call_of_the_last_rank_is_the_story():
    # The job: ranks 0-2 finish #40 and exit; rank 3 issues #41 (its final metrics).
    check_extra_call(4, 3)


@case
def extra_call_of_half_the_ranks_is_the_story():
    # As many ranks issue the extra call as ended: the call is the story, not the ended ranks.
    check_extra_call(4, 2)


@case
def whole_job_killed_at_once_is_one_story():
    # Every rank SIGKILLed within a few ms in the middle of the loop (the scheduler, the launcher):
    # one story, "the job was killed from outside", no rank_dead with OOM advice, exit status 0
    # (no rank waited on another: nothing hangs).
    def kill_all(p):
        pids = wait_for_ranks(p, 4)
        boxes = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "boxes")
        wait_for(lambda: len(glob.glob(os.path.join(boxes, "ncclwatch-box-*"))) == 4, "4 black boxes")
        time.sleep(0.7)  # in the loop, a few watchdog polls
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    j = job(4, ["--iters", "100000", "--jitter-ms", "5"], env={"NCCLWATCH_TIMEOUT": "5"}, timeout=20,
            after_start=kill_all)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_")}
    env["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(j.tmp, "boxes")
    os.makedirs(j.dir, exist_ok=True)  # killed before any dump: nobody made it
    c = subprocess.run([built("bin", "ncclwatch"), "collect", j.dir], env=env, capture_output=True, text=True)
    check(all(j.reasons(r) == ["postmortem"] for r in range(4)),
          f"each rank's postmortem: {[j.reasons(r) for r in range(4)]}\n{c.stderr[-1500:]}")
    rc, report, text = analyze(j)
    what = json.dumps(report["verdicts"], indent=1)[:3000]
    check([v["cause"] for v in report["verdicts"]] == ["job_killed"], f"one story:\n{what}")
    v = report["verdicts"][0]
    check(v["killed_ranks"] == [0, 1, 2, 3] and 0 <= v["killed_within_ms"] < 1000, f"every rank, within a moment:\n{what}")
    check(rc == 0, f"exit status 0: nothing hangs ({rc})")
    check(re.search(r"every rank ended within \d+ ms: the job was killed from outside", text) and "OOM" not in text,
          f"the text tells it, without OOM advice:\n{text[:3000]}")


@case
def host_lost_while_others_wait_is_one_story():
    # Two simulated hosts of 2 ranks; both ranks of simhost1 are SIGKILLed within a few ms (a
    # node lost) while simhost0's ranks go on into the next all-reduce and wait. One verdict
    # names the host, not one rank_dead per rank.
    def kill_host(p):
        wait_for_ranks(p, 4)
        pids = [rank_pid(p, 2), rank_pid(p, 3)]
        boxes = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "boxes")
        wait_for(lambda: len(glob.glob(os.path.join(boxes, "ncclwatch-box-*"))) == 4, "4 black boxes")
        time.sleep(0.7)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    j = job(4, ["--iters", "100000", "--jitter-ms", "5"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=9,
            after_start=kill_host, launcher_args=["--hosts", "2"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_")}
    env["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(j.tmp, "boxes")
    subprocess.run([built("bin", "ncclwatch"), "collect", j.dir], env=env, capture_output=True, text=True)
    check(all("postmortem" in j.reasons(r) for r in (2, 3)), f"ranks 2, 3: {[j.reasons(r) for r in range(4)]}")
    rc, report, text = analyze(j)
    what = json.dumps(report["verdicts"], indent=1)[:3000]
    v = report["verdicts"][0]
    check(rc == 1 and v["cause"] == "host_lost" and v["culprit_ranks"] == [2, 3] and v["killed_host"] == "simhost1",
          f"host_lost names simhost1's ranks ({rc}):\n{what}")
    check(not [x for x in report["verdicts"] if x["cause"] == "rank_dead"], f"no rank_dead besides:\n{what}")
    check(re.search(r"every rank of host simhost1 \(ranks 2, 3\) ended within \d+ ms; others wait in", text),
          f"the headline:\n{text[:3000]}")

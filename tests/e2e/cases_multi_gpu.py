"""Several GPUs in one process (nccl-tests -g N, JAX's one process per host, ncclCommInitAll):
every rank a process drives is a rank of its own in the analysis, named with its device, pid
and host (sim_multi_gpu: process p drives global ranks p*G .. p*G+G-1, one per device)."""
import glob
import json
import os
import subprocess

from e2e_common import Failure, analyze, built, case, check, job, only_exit_records

GPUS = 4
STALL = {"NCCLWATCH_TIMEOUT": "3"}


def multi_gpu_job(args, procs=2, timeout=10):
    return job(procs, ["--gpus", str(GPUS), "--steps", "40"] + args, env=STALL, timeout=timeout,
               program="sim_multi_gpu")


def process_of(j, rank):
    """(host, pid) of the process that drives global rank `rank`, as its dumps' communicators say."""
    for path in glob.glob(os.path.join(j.dir, "rank*.json")):
        with open(path) as f:
            s = json.load(f)["summary"]
        world = max([c["size"] for c in s["comms"]] or [0])
        if any(c["size"] == world and c["rank"] == rank for c in s["comms"]):
            return s["host"], s["pid"]
    raise Failure(f"no dump's communicators hold rank {rank}: {os.listdir(j.dir)}")


def verdict(j, cause, culprits, world=GPUS * 2):
    rc, report, text = analyze(j)
    vs = report["verdicts"]
    what = json.dumps(vs, indent=1)[:2500] + "\n" + text[:3000]
    check(rc == 1 and vs and vs[0]["cause"] == cause and sorted(vs[0]["culprit_ranks"]) == culprits,
          f"{cause} {culprits} (exit {rc}):\n{what}")
    check(f"{world} ranks with dumps, world size {world}" in text, f"every rank of every process is a rank:\n{text[:800]}")
    return vs[0], text


@case
def multi_gpu_stuck_stream():
    # Device 2 of the second process: its stream runs a kernel that never ends before step 10.
    j = multi_gpu_job(["--stuck", "1:2:10"])
    v, text = verdict(j, "gpu_not_reached", [6])
    check(v["seq"] == 10, f"at #10: {v['seq']}")
    host, pid = process_of(j, 6)
    check(f"rank 6 (device 2 of pid {pid} on {host}, which drives ranks 4-7)" in text,
          f"the culprit named with its device, pid and host:\n{text[:2000]}")
    s = v["culprit_stacks"]["6"]
    check(s.get("device") == 2 and s["pid"] == pid and s.get("process_ranks") == [4, 5, 6, 7],
          f"its device and its process's ranks in the JSON: {json.dumps(s)[:600]}")
    # The timeline: one track per rank, each with its own stream.
    out = os.path.join(j.tmp, "timeline.json")
    r = subprocess.run([built("bin", "ncclwatch"), "timeline", j.dir, "-o", out], capture_output=True, text=True)
    check(r.returncode == 0, f"timeline: {r.stderr[-800:]}")
    with open(out) as f:
        events = json.load(f)["traceEvents"]
    tracks = sorted(e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name")
    check([t.split(" (")[0] for t in tracks] == [f"rank {r}" for r in range(8)], f"a track per rank: {tracks}")
    check(all(f"pid {pid})" in t for t in tracks[4:]), f"ranks 4-7 are the process of pid {pid}: {tracks}")


@case
def multi_gpu_busy_process():
    # The second process is busy in host code from step 10: every rank it drives misses #10.
    j = multi_gpu_job(["--busy", "1:10"])
    v, text = verdict(j, "rank_missing", [4, 5, 6, 7])
    rc, report, _ = analyze(j)
    check(len(report["verdicts"]) == 1, f"one verdict for the process: {[x['cause'] for x in report['verdicts']]}")
    host, pid = process_of(j, 4)
    check(f"ranks 4-7 (every rank of pid {pid} on {host}) never entered AllReduce #10" in text,
          f"the verdict names the process and its ranks:\n{text[:2000]}")
    check(text.count(f"rank 5 (device 1 of the same pid {pid})") == 1, f"its other ranks in one line each:\n{text[:3000]}")


@case
def multi_gpu_mismatch_between_devices():
    # Device 1 of the first process calls step 10's all-reduce with another count.
    j = multi_gpu_job(["--mismatch", "0:1:10"])
    v, text = verdict(j, "mismatch", [1])
    host, pid = process_of(j, 1)
    check(f"rank 1 (device 1 of pid {pid} on {host}" in text, f"the culprit named with its device:\n{text[:2000]}")


@case
def multi_gpu_no_rank_in_environment():
    # No RANK, WORLD_SIZE or LOCAL_RANK (JAX, nccl-tests): each process is named by the lowest
    # rank it drives, and the analysis is per rank all the same.
    j = multi_gpu_job(["--no-rank-env", "--stuck", "1:3:10"])
    names = sorted({os.path.basename(p).split("-")[0] for p in glob.glob(os.path.join(j.dir, "rank*.json"))})
    check(names == ["rank00000", "rank00004"], f"the processes are named by their lowest ranks: {names}")
    verdict(j, "gpu_not_reached", [7])


@case
def multi_gpu_init_all():
    # One process, ncclCommInitAll over 4 devices, no RANK: device 1's stream is stuck.
    j = multi_gpu_job(["--init-all", "--no-rank-env", "--stuck", "0:1:10"], procs=1)
    v, text = verdict(j, "gpu_not_reached", [1], world=GPUS)
    host, pid = process_of(j, 1)
    check(f"rank 1 (device 1 of pid {pid} on {host}, which drives ranks 0-3)" in text, f"named:\n{text[:2000]}")


@case
def multi_gpu_healthy():
    j = job(2, ["--gpus", str(GPUS), "--steps", "30"], env=STALL, timeout=30, program="sim_multi_gpu")
    check(j.rc == 0, f"the job succeeds (exit {j.rc}):\n{j.err[-2000:]}")
    only_exit_records(j, "a healthy multi-GPU run")
    rc, report, text = analyze(j)
    check(rc == 0 and [v["cause"] for v in report["verdicts"]] == ["no_hang"], f"no hang (exit {rc}):\n{text[:1500]}")
    check(f"{GPUS * 2} ranks with dumps, world size {GPUS * 2}" in text, f"every rank is seen:\n{text[:800]}")


@case
def multi_gpu_metrics_per_rank():
    # NCCLWATCH_METRICS: a process that drives 4 ranks holds one communicator id as 4 ranks; each
    # is a series of its own with its global rank as the `rank` label (never one label set twice,
    # which the collector rejects).
    import re
    from cases_command import check_prometheus_text
    from ncclwatch_testing import read_text, temp_dir, wait_for
    metrics = temp_dir("ncclwatch-e2e-metrics-")
    seen = {}

    def counted():
        texts = {p: read_text(p) for p in glob.glob(os.path.join(metrics, "*.prom"))}
        ok = len(texts) == 2 and all(re.search(r"^ncclwatch_collectives_completed_total\{.*\} [1-9]", t, re.M)
                                     for t in texts.values())
        return ok and texts

    def sample(p):
        seen.update(wait_for(counted, "two metrics files counting completions"))
    j = job(2, ["--gpus", str(GPUS), "--steps", "40", "--busy", "1:30"],
            env={"NCCLWATCH_METRICS": metrics, "NCCLWATCH_TIMEOUT": "600"}, timeout=12, program="sim_multi_gpu",
            after_start=sample)
    ranks_seen = set()
    for path, text in seen.items():
        samples = check_prometheus_text(text)
        keys = [(n, l) for n, l, v in samples]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        check(not dup, f"{path}: a label set twice: {dup[:4]}\n{text[:1500]}")
        done = [l for n, l, v in samples if n == "ncclwatch_collectives_completed_total"]
        ranks = sorted(int(re.search(r'rank="(\d+)"', l).group(1)) for l in done)
        check(ranks in ([0, 1, 2, 3], [4, 5, 6, 7]), f"{path}: one series per rank it drives: {done}")
        ranks_seen.update(ranks)
    check(ranks_seen == set(range(8)), f"every rank has its series: {sorted(ranks_seen)}")

#!/usr/bin/env python3
"""End-to-end tests of libncclwatch.so: real multi-process jobs over the GPU-free simulator.

    run_e2e.py --build BUILD_DIR CASE [CASE...]     (ctest runs one case per test)
    run_e2e.py --build BUILD_DIR --list

Each case starts ranks with tools/sim's launcher (simlaunch) and the simulator's libnccl.so.2 /
libcuda.so.1, with libncclwatch.so preloaded, then checks the dumps the ranks wrote.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import (Failure, catches, blocked_in_syscall, check, child_pids, read_text, run_cases, temp_dir,  # noqa: E402
                               wait_for, wait_for_ranks)

B = None  # build directory
CASES = {}
# Cases that measure time (how soon a stall is seen, who is slow, how long a stop takes): ctest
# runs them alone.
SERIAL = {"busy_rank_every_rank_dumps", "adaptive_deadline_within_15s", "stall_then_recovery", "slow_rank_named",
          "healthy_jitter_names_nobody", "slow_rank_below_a_hang", "run_reports_a_healthy_stop",
          "recovered_stall_is_no_hang", "c_example_gives_its_promised_verdict", "early_dump_names_what_is_not_yet_due",
          "run_prints_no_live_verdict_after_recovery"}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Job:
    def __init__(self, rc, out, err, tmp):
        self.rc, self.out, self.err, self.tmp = rc, out, err, tmp
        self.dir = os.path.join(tmp, "dumps")

    def dumps(self):
        """{rank: [dump, ...]} ordered by dump_seq."""
        by_rank = {}
        for path in sorted(glob.glob(os.path.join(self.dir, "rank*.json"))):
            with open(path) as f:
                d = json.load(f)
            d["_path"] = path
            by_rank.setdefault(d["summary"]["rank"], []).append(d)
        for v in by_rank.values():
            v.sort(key=lambda d: d["summary"]["dump_seq"])
        return by_rank

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
        launcher_args=()):
    """Runs the job under simlaunch; after_start(launcher) runs while it does. Its output goes to
    files (no pipe to fill while after_start waits)."""
    tmp = temp_dir("ncclwatch-e2e-")
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    for k in list(e):
        if k.startswith("NCCLWATCH_"):
            del e[k]
    e["NCCLWATCH_DIR"] = os.path.join(tmp, "dumps")
    e["NCCLWATCH_PEER_POLL_MS"] = "200"
    # Each case's black boxes apart: a case's host caretaker converts only its own job's dead.
    e["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(tmp, "boxes")
    os.makedirs(e["NCCLWATCH_BLACKBOX_DIR"])
    if preload:
        e["LD_PRELOAD"] = os.path.join(B, "lib", "libncclwatch.so")
    e.update(env or {})
    cmd = [os.path.join(B, "bin", "simlaunch"), "-n", str(n), "--timeout", str(timeout)] + list(launcher_args) + \
          ["--", os.path.join(B, "bin", program)] + args
    out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(cmd, env=e, cwd=cwd or tmp, stdout=out, stderr=err)
    try:
        if after_start:
            after_start(p)
        p.wait(timeout=timeout + 60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return Job(p.returncode, read_text(out_path), read_text(err_path), tmp)


def ring_entries(d):
    """The ring's operations as objects, decoded from version 2's shapes and rows as
    docs/trace-format.md describes them (a second reader, independent of the C++ one)."""
    ring = d["ring"]
    if "entries" in ring:
        return ring["entries"]
    states = ["pending_launch", "enqueued", "gpu_reached", "completed", "error", "captured", "unmonitored", "unknown"]
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


def world_comm(d):
    return max(d["summary"]["comms"], key=lambda c: c["size"])


# ---------------------------------------------------------------------------------------------
# A process that never uses NCCL, or uses only queries, must not notice us.

@case
def healthy_run_leaves_only_exit_records():
    j = job(4, ["--iters", "200", "--comms", "2"])
    check(j.rc == 0, f"job failed ({j.rc}): {j.err[-2000:]}")
    check(j.out.count("ok") == 4, "every rank prints ok")
    # One small exit record per rank (where it stopped, for ranks that might wait on it) and
    # nothing else; nothing said on stderr.
    files = sorted(os.listdir(j.dir))
    check(len(files) == 4 and all(f.endswith("-exit.json") for f in files), f"one exit record per rank: {files}")
    for f in files:
        path = os.path.join(j.dir, f)
        check(os.path.getsize(path) < 64 * 1024, f"{f} is small: {os.path.getsize(path)} bytes")
        with open(path) as fh:
            d = json.load(fh)
        s = d["summary"]
        check(s["reason"] == "exit" and s["exit_status"] == 0 and not s["in_flight"], f"{f}: a clean exit: {s['reason']}")
        # Written by the exiting thread itself: its stack starts where the application exits,
        # not in ncclwatch's own dump code.
        top = [t["frames"][0] for t in d["threads"] if t["name"] == "exiting thread" and t["frames"]]
        module = d["modules"][top[0]["module"]] if top else {}  # version 2: frames name a module by index
        check(top and not module["path"].endswith("libncclwatch.so") and module["build_id"],
              f"{f}: the exiting thread's stack starts outside ncclwatch: {top[:1]}")
        check(all(c["last_completed"] == c["last_enqueued"] for c in s["comms"]), f"{f}: everything completed")
    check(not j.ncclwatch_lines(), f"no output from ncclwatch: {j.ncclwatch_lines()}")
    rc, report = analyze_dir(j.dir)
    check(rc == 0 and report["verdicts"][0]["cause"] == "no_hang", f"analyze: no_hang, exit 0 ({rc})")
    j = job(2, ["--iters", "20"], env={"NCCLWATCH_EXIT_RECORD": "0"})
    check(j.rc == 0 and not os.path.exists(j.dir), "NCCLWATCH_EXIT_RECORD=0: no file at all")


@case
def non_nccl_process_untouched():
    lib = os.path.join(B, "lib", "libncclwatch.so")
    probe = ["python3", "-c", "import os,threading; print(len(os.listdir('/proc/self/task')), sorted(os.listdir('.')))"]
    for preload in (False, True):
        cwd = temp_dir("ncclwatch-e2e-")
        env = dict(os.environ, LD_PRELOAD=lib) if preload else dict(os.environ)
        r = subprocess.run(probe, env=env, cwd=cwd, capture_output=True, text=True)
        if not preload:
            baseline = r
        else:
            check(r.returncode == 0 and r.stdout == baseline.stdout, f"same threads and files: {r.stdout!r} vs {baseline.stdout!r}")
            check(r.stderr == "", f"no output: {r.stderr!r}")
            t = subprocess.run(["/bin/true"], env=env, cwd=cwd, capture_output=True, text=True)
            check(t.returncode == 0 and t.stdout == "" and t.stderr == "", "/bin/true untouched")
            check(os.listdir(cwd) == [], "no file written")


@case
def version_only_starts_nothing():
    lib = os.path.join(B, "lib", "libncclwatch.so")
    exe = os.path.join(B, "bin", "e2e_version_only")
    dirs = [os.path.join(B, "sim")]
    for real in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib"):
        if os.path.exists(os.path.join(real, "libnccl.so.2")):
            dirs.append(real)  # the real NCCL, where the toolkit is installed
            break
    for libdir in dirs:
        cwd = temp_dir("ncclwatch-e2e-")
        env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=libdir)
        r = subprocess.run([exe], env=env, cwd=cwd, capture_output=True, text=True)
        check(r.returncode == 0, f"{libdir}: ncclGetVersion works through the library: {r.stdout} {r.stderr}")
        fields = r.stdout.split()
        check(int(fields[1]) >= 21800, f"{libdir}: a version >= 2.18 ({r.stdout})")
        check(fields[5] == "1", f"{libdir}: one thread only, no watchdog ({r.stdout})")
        check(fields[7] == "0" and os.listdir(cwd) == [], f"{libdir}: no file ({r.stdout})")
        check(r.stderr == "", f"{libdir}: no output ({r.stderr!r})")
        print(f"  {libdir}: {r.stdout.strip()}")


@case
def disable_is_pass_through():
    j = job(3, ["--iters", "8", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "2500"],
            env={"NCCLWATCH_DISABLE": "1", "NCCLWATCH_TIMEOUT": "1"})
    check(j.rc == 0, f"job ok: {j.err[-2000:]}")
    check(not os.path.exists(j.dir), "no dump when disabled")
    check(not j.ncclwatch_lines(), "no output when disabled")


# ---------------------------------------------------------------------------------------------
# Stalls, and every rank's evidence.

@case
def busy_rank_every_rank_dumps():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "3"}, timeout=12)
    dumps = j.dumps()
    check(sorted(dumps) == [0, 1, 2, 3], f"every rank dumped: {sorted(dumps)}")
    stall_times = []
    for r in (1, 2, 3):
        d = j.first(r, "stall")
        s = stalled(d)
        check(s["op"] == "AllReduce" and s["seq"] == 6, f"rank {r} stalled at AllReduce seq 6: {s}")
        check(s["state"] == "gpu_reached", f"rank {r}: its GPU is inside the collective: {s['state']}")
        check(world_comm(d)["last_enqueued"] == 6, "waiting ranks issued seq 6")
        stall_times.append(os.stat(d["_path"]).st_mtime)
    d0 = j.first(0, "peer_request")
    s0 = d0["summary"]
    check(s0["in_nccl"] == [], f"the busy rank is not inside NCCL: {s0['in_nccl']}")
    check(world_comm(d0)["last_enqueued"] == 5, "the busy rank never issued seq 6")
    check(s0["trigger"]["origin_rank"] in (1, 2, 3), "the request names its origin")
    lag = os.stat(d0["_path"]).st_mtime - min(stall_times)
    check(lag < 5, f"the busy rank dumped within a few seconds of the first stall dump ({lag:.1f} s)")
    check(any(t["frames"] for t in d0["threads"]), "the busy rank's dump has native stacks")
    check(len(ring_entries(d0)) == 5, "its ring holds its five operations")
    for d in (d0, j.first(1, "stall")):  # two readers of the compact ring agree: this file's, and the C++ one
        shown = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "show", "--json", d["_path"]],
                               capture_output=True, text=True)
        check(json.loads(shown.stdout)["ring"]["entries"] == ring_entries(d), "show --json decodes the ring the same")


def shared_checks_by_rank(j):
    """{rank: checks of the shared dump directory} from each rank's debug line at exit."""
    out = {}
    for line in j.err.splitlines():
        m = re.search(r"\[rank (\d+) pid \d+\]: job-wide request: (\d+) checks of the shared dump directory", line)
        if m:
            out[int(m.group(1))] = int(m.group(2))
    return out


@case
def relay_one_reader_per_host():
    relay = temp_dir("ncclwatch-e2e-relay-")
    hosts = {"simhost0": range(0, 4), "simhost1": range(4, 8)}
    # Idle for 3 s: one process per host reads the shared directory, the others the relay.
    j = job(8, ["--iters", "5", "--linger-ms", "3000"], launcher_args=["--hosts", "2"], timeout=30,
            env={"NCCLWATCH_PEER_POLL_MS": "100", "NCCLWATCH_LOG": "debug", "NCCLWATCH_RELAY_DIR": relay})
    check(j.rc == 0, f"the job ran: {j.rc}\n{j.err[-1500:]}")
    checks = shared_checks_by_rank(j)
    check(sorted(checks) == list(range(8)), f"every rank said how often it read the shared directory: {checks}")
    for host, ranks in hosts.items():
        readers = [r for r in ranks if checks[r] >= 10]
        check(len(readers) == 1, f"{host}: one rank reads the shared directory: {checks}")
        # A rank that outlives the watcher by a poll or two takes over for those polls only.
        check(all(checks[r] <= 3 for r in ranks if r not in readers), f"{host}: the others read the relay: {checks}")
    check(os.listdir(relay) == [], f"the watchers left nothing behind: {os.listdir(relay)}")
    # A request still reaches every rank, on both hosts, through the relays.
    j = job(8, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            launcher_args=["--hosts", "2"], env={"NCCLWATCH_TIMEOUT": "3", "NCCLWATCH_RELAY_DIR": relay}, timeout=15)
    dumps = j.dumps()
    check(sorted(dumps) == list(range(8)), f"every rank dumped: {sorted(dumps)}\n{j.err[-1500:]}")
    j.first(0, "peer_request")
    for host, ranks in hosts.items():
        for r in ranks:
            check(dumps[r][0]["summary"]["host"] == host, f"rank {r} is on {host} (NCCLWATCH_HOST)")


@case
def relay_missing_dir_each_rank_reads():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            launcher_args=["--hosts", "2"], timeout=12,
            env={"NCCLWATCH_TIMEOUT": "3", "NCCLWATCH_RELAY_DIR": "/nonexistent/ncclwatch-relay"})
    lines = [l for l in j.ncclwatch_lines() if "NCCLWATCH_RELAY_DIR" in l]
    check(len(lines) == 4 and all("reads the job-wide dump request in the dump directory itself" in l for l in lines),
          f"one line per rank: {lines}")
    check(sorted(j.dumps()) == [0, 1, 2, 3], "the request still reached every rank")
    j.first(0, "peer_request")


@case
def adaptive_deadline_within_15s():
    # No NCCLWATCH_TIMEOUT: with millisecond collectives the adaptive deadline applies.
    j = job(4, ["--iters", "400", "--busy-rank", "0", "--busy-at", "150", "--busy-ms", "-1"], timeout=30)
    d = j.first(1, "stall")
    s = stalled(d)
    check(s["seq"] == 151, f"stalled at seq 151: {s['seq']}")
    check(s["deadline_s"] <= 12, f"adaptive deadline applied ({s['deadline_s']} s)")
    check(s["age_s"] <= 15, f"reported within 15 s ({s['age_s']:.1f} s)")
    print(f"  reported after {s['age_s']:.1f} s, deadline {s['deadline_s']:.1f} s")


@case
def gpu_not_reached():
    # Rank 2's own kernel before iteration 5 never ends: its GPU never reaches seq 6.
    j = job(4, ["--iters", "20", "--slow-kernel-rank", "2", "--slow-kernel-at", "5", "--slow-kernel-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "3"}, timeout=12)
    s2 = stalled(j.first(2, "stall"))
    check(s2["seq"] == 6 and s2["state"] == "enqueued", f"rank 2's GPU never reached seq 6: {s2}")
    for r in (0, 1, 3):
        s = stalled(j.first(r, "stall"))
        check(s["seq"] == 6 and s["state"] == "gpu_reached", f"rank {r} waits inside seq 6: {s}")


@case
def transport_stall():
    j = job(4, ["--iters", "20"], env={"NCCLWATCH_TIMEOUT": "3", "NCCLWATCH_SIM_FAULT": "stall:rank=1,seq=4"},
            timeout=12)
    for r in range(4):
        s = stalled(j.first(r, "stall"))
        check(s["seq"] == 4 and s["state"] == "gpu_reached", f"rank {r} inside seq 4: {s}")
        check(world_comm(j.first(r, "stall"))["last_completed"] == 3, "seq 3 was the last completed")


@case
def abort_dumps_before_forwarding():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1",
                "--abort-after-ms", "2000"], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=15)
    for r in (1, 2, 3):
        d = j.first(r, "abort")
        inflight = d["summary"]["in_flight"]
        check(any(o["seq"] == 6 for o in inflight), f"rank {r}: seq 6 still in flight when dumped: {inflight}")
    check("exited with code 6" in j.err or "exit 6" in j.err or j.rc != 0, "ranks exited through their abort path")
    j.first(0, "peer_request")


@case
def sigterm_dumps_and_keeps_status():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "600"}, timeout=4)
    check(j.rc == 124, f"the launcher timed out and sent SIGTERM ({j.rc})")
    for r in range(4):
        j.first(r, "signal")
    check(j.err.count("SIGTERM") >= 4, f"every rank still died of SIGTERM:\n{j.err[-1500:]}")


@case
def secrets_never_reach_a_dump():
    secrets = ["abc123secretvalue", "xyz987secretvalue", "wandbkeyvalue42", "hf_abcdefghijklmnopqrstuvwxyz0123"]
    j = job(2, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1", "--",
                "--hf_token=" + secrets[0], "--api-key", secrets[1], secrets[3], "--lr", "0.1"],
            env={"NCCLWATCH_TIMEOUT": "600", "WANDB_API_KEY": secrets[2], "PMI_FD": "7"}, timeout=4)
    files = glob.glob(os.path.join(j.dir, "rank*.json"))
    check(len(files) >= 2, f"every rank dumped on SIGTERM: {files}\n{j.err[-1500:]}")
    for path in files:
        with open(path) as f:
            text = f.read()
        for s in secrets:
            check(s not in text, f"{path} holds the secret {s}")
        check("PMI_FD" not in text and "WANDB_API_KEY" not in text, f"{path}: undocumented variables recorded")
    d = j.first(1, "signal")
    cmd = d["process"]["cmdline"]
    check("--hf_token=<redacted>" in cmd and "--lr" in cmd and "0.1" in cmd, f"the rest of argv is kept: {cmd}")
    check(oct(os.stat(files[0]).st_mode & 0o777) == "0o644", "dumps are 0644 as documented")
    # NCCLWATCH_CMDLINE=0: no argv at all.
    j = job(2, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1", "--", "--lr", "0.1"],
            env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_CMDLINE": "0"}, timeout=4)
    d = j.first(1, "signal")
    check(d["process"]["cmdline"] == [], f"NCCLWATCH_CMDLINE=0 records no command line: {d['process']['cmdline']}")


def leftover_temporaries(j):
    return glob.glob(os.path.join(j.dir, ".tmp-*"))


@case
def second_signal_keeps_first_dump_and_status():
    # Ctrl-C, then the launcher's SIGTERM a moment later: the first signal's dump is written and
    # the ranks end as the first signal would have ended them.
    for gap_ms in (0, 5, 20, 0, 20):
        def poke(p, gap=gap_ms):
            pids = ranks_catching(p, 3, signal.SIGINT, signal.SIGTERM)
            for sig, pause in ((signal.SIGINT, gap / 1000.0), (signal.SIGTERM, 0)):
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass  # already ended by the first signal: nothing left to race
                time.sleep(pause)  # the gap between the two signals is what this case varies
        j = job(3, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
                env={"NCCLWATCH_TIMEOUT": "600"}, timeout=30, after_start=poke)
        for r in range(3):
            d = j.first(r, "signal")
            check("SIGINT" in d["summary"]["detail"], f"gap {gap_ms} ms: rank {r}'s dump is the first signal's: "
                  f"{d['summary']['detail']}")
            check(f"rank {r} killed by SIGINT" in j.err, f"gap {gap_ms} ms: rank {r} ended by SIGINT:\n{j.err[-2000:]}")
        check(not leftover_temporaries(j), f"gap {gap_ms} ms: temporary files left: {leftover_temporaries(j)}")


@case
def abandoned_signal_dump_leaves_no_file():
    for wait_ms in ("0", "0", "1", "2", "4"):
        j = job(3, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
                env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_SIGNAL_WAIT_MS": wait_ms}, timeout=4)
        check(not leftover_temporaries(j), f"wait {wait_ms} ms: temporary files left: {leftover_temporaries(j)}")
        abandoned = [l for l in j.ncclwatch_lines() if "did not finish within NCCLWATCH_SIGNAL_WAIT_MS" in l]
        for r in range(3):
            check(f"rank {r} killed by SIGTERM" in j.err, f"wait {wait_ms} ms: rank {r} still ended by SIGTERM")
        dumped = sum(1 for r in range(3) if "signal" in j.reasons(r))
        check(dumped + len(abandoned) >= 3, f"wait {wait_ms} ms: each rank dumped or said it abandoned its dump "
              f"({dumped} dumps, lines {abandoned})")
        if wait_ms == "0":
            check(len(abandoned) == 3 and dumped == 0, f"no wait: every rank says so, once ({abandoned})")
            check("abandoned, no partial file left" in abandoned[0], abandoned[0])


@case
def sigterm_chains_to_app_handler():
    j = job(2, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1", "--sigterm-handler"],
            env={"NCCLWATCH_TIMEOUT": "600"}, timeout=4)
    check(j.out.count("app handler ran") == 2, f"the application's handler ran on both ranks: {j.out}")
    check(j.err.count("code 42") == 2, f"and its exit status was kept:\n{j.err[-1500:]}")
    for r in range(2):
        j.first(r, "signal")


def signal_app(scenario, preload):
    j = job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=20, preload=preload, program="e2e_signal_app")
    ending = [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]
    return j, ending


@case
def signals_chained_as_without_ncclwatch():
    # The application's own dispositions, set before NCCL starts: each run ends exactly as the
    # same program without the library (the kernel's rules: SA_RESETHAND runs a handler once, a
    # fault is never ignored, an ignored signal stays ignored in the process and its children).
    want_end = {"resethand_segv": "killed by SIGSEGV", "ignored_segv": "killed by SIGSEGV",
                "resethand_term": "killed by SIGTERM", "ignored_term": None,  # None: exit 0, no line
                "term_then_segv": "killed by SIGTERM", "forked_child_usr2": None}
    for scenario, end in want_end.items():
        without, ending_without = signal_app(scenario, preload=False)
        got, ending = signal_app(scenario, preload=True)
        if end is None:
            check(without.rc == 0 and not ending_without, f"{scenario} without ncclwatch: {without.rc} {ending_without}")
        else:
            check(ending_without and end in ending_without[0], f"{scenario} without ncclwatch: {ending_without}")
        check(ending == ending_without and got.rc == without.rc,
              f"{scenario}: {got.rc} {ending} with ncclwatch, {without.rc} {ending_without} without:\n{got.err[-1500:]}")
        check(got.out == without.out, f"{scenario}: output {got.out!r} with ncclwatch, {without.out!r} without")
        check("started" in got.out, f"{scenario}: the program reached NCCL: {got.out!r}")
        reasons = got.reasons(0)
        if scenario == "resethand_term":  # the first SIGTERM is dumped, then handled once
            check(reasons[:1] == ["signal"], f"{scenario}: a signal dump first: {reasons}")
            check(got.out.count("term handler ran") == 1, got.out)
        elif scenario == "resethand_segv":
            check(reasons[:1] == ["fatal_signal"], f"{scenario}: the crash is dumped: {reasons}")
            check(got.out.count("segv handler ran") == 1, got.out)
        elif scenario == "term_then_segv":  # the first leads: its dump, its status
            check(reasons[:1] == ["signal"], f"{scenario}: the SIGTERM is dumped: {reasons}")
        elif scenario == "forked_child_usr2":  # the child (not ncclwatch's) dies of it at once
            check("child killed by signal 12" in got.out, f"{scenario}: {got.out!r}")
        elif scenario == "ignored_term":  # no handler, no dump: only the exit record
            check(reasons == ["exit"], f"{scenario}: an ignored signal writes nothing: {reasons}")
            ignored = [l.split()[-1] for l in got.out.splitlines() if "SigIgn" in l]
            check(len(ignored) == 2 and all(int(m, 16) & 0x4002 == 0x4002 for m in ignored),
                  f"{scenario}: SIGINT and SIGTERM still ignored in the process and its child: {got.out!r}")


def same_as_without(run, scenario, end, must_say=()):
    """Runs `scenario` without and with the library (run(scenario, preload) -> (Job, ending lines)):
    the same exit status, ending signal and output; `end` is the ending line's tail (None: exit 0)."""
    without, ending_without = run(scenario, False)
    got, ending = run(scenario, True)
    if end is None:
        check(without.rc == 0 and not ending_without, f"{scenario} without ncclwatch: {without.rc} {ending_without}")
    else:
        check(ending_without and end in ending_without[0], f"{scenario} without ncclwatch: {ending_without}\n{without.out}")
    check(ending == ending_without and got.rc == without.rc,
          f"{scenario}: {got.rc} {ending} with ncclwatch, {without.rc} {ending_without} without:\n{got.err[-1500:]}")
    check(got.out == without.out, f"{scenario}: output {got.out!r} with ncclwatch, {without.out!r} without")
    for line in must_say:
        check(line in got.out, f"{scenario}: says {line!r}: {got.out!r}")
    check("terminate called" not in got.err, f"{scenario}: an exception reached the application:\n{got.err[-1500:]}")
    return got


@case
def signals_as_the_kernel_delivers_them():
    # The kernel's rules, each against the same program without the library: a signal sent to
    # the process goes to a thread that does not block it (or stays pending while all do), also
    # once the main thread has exited; an application's handler runs with its own flags (no
    # SA_RESTART, no SA_ONSTACK it did not ask for) and mask, may leave with longjmp, and may call
    # exit() while the interrupted thread holds malloc's lock.
    run = lambda scenario, preload: signal_app(scenario, preload)
    got = same_as_without(run, "blocked_abrt", "killed by SIGABRT", ["worker unblocks SIGABRT"])
    check(got.reasons(0)[:1] == ["fatal_signal"], f"blocked_abrt: the SIGABRT is dumped: {got.reasons(0)}")
    same_as_without(run, "main_exited_abrt", "killed by SIGABRT", ["worker unblocks SIGABRT"])
    got = same_as_without(run, "term_no_restart", None, ["read returned -1 (EINTR), handler ran: 1"])
    check(got.reasons(0)[:1] == ["signal"], f"term_no_restart: the SIGTERM is dumped: {got.reasons(0)}")
    same_as_without(run, "longjmp_int", "killed by SIGTERM", ["after the jump: SIGINT blocked 1, SIGTERM blocked 0"])
    same_as_without(run, "exit_in_handler", "exited with code 5")
    same_as_without(run, "term_no_onstack", None, ["term handler on the thread's stack", "term handler returned"])


def ready_then_dump(cwd, dumps):
    """after_start: once the program says it waits (a file "ready" in its directory), a
    job-wide dump request, as `ncclwatch dump` makes it."""
    def after(p):
        for _ in range(600):
            if os.path.exists(os.path.join(cwd, "ready")) or p.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        subprocess.run([os.path.join(B, "bin", "ncclwatch"), "dump", dumps, "--wait", "10"],
                       capture_output=True, text=True, timeout=60)
    return after


def app_with_dump(program, scenario, preload):
    cwd = temp_dir("ncclwatch-e2e-app-")
    dumps = os.path.join(cwd, "dumps")
    j = job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_DIR": dumps,
                                "E2E_READY_FILE": os.path.join(cwd, "ready")}, timeout=30, preload=preload,
            program=program, cwd=cwd, after_start=ready_then_dump(cwd, dumps))
    j.dir = dumps
    return j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]


@case
def dump_keeps_waits_whole():
    # A job-wide dump samples the stacks of the main thread (in sleep) and of a thread that
    # called NCCL (in sem_timedwait, then nanosleep): threads blocked in a system call are
    # sampled without a signal, so each wait keeps its length and result, as without the library.
    run = lambda scenario, preload: app_with_dump("e2e_signal_app", scenario, preload)
    got = same_as_without(run, "waits_in_full", None,
                          ["main: sleep(4) left 0 after 4 s", "sem_timedwait -1 Connection timed out after 3 s"])
    d = got.first(0, "peer_request")
    main = [t for t in d["threads"] if t["tid"] == d["summary"]["pid"]]
    check(main and main[0]["frames"], f"the main thread's stack is sampled: {main}")
    others = [t for t in d["threads"] if not t["own"] and t["tid"] != d["summary"]["pid"] and t["frames"]]
    check(others, f"the waiting NCCL thread's stack is sampled: {[(t['tid'], t['note']) for t in d['threads']]}")


@case
def resources_as_without_ncclwatch():
    # No descriptor, mapping or exception of ours reaches the application: a process that never
    # starts ncclwatch has no descriptor and no library more; one that closed every descriptor
    # at start finds its own files untouched by a dump; one that runs out of memory exits with
    # its own status, whatever of ours could not allocate.
    plain = lambda scenario, preload: (lambda j: (j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]))(
        job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=60, preload=preload, program="e2e_resource_app"))
    for scenario in ("never_nccl", "unique_id_only"):
        same_as_without(plain, scenario, None, [f"{scenario}: libunwind mapped 0, liblzma mapped 0"])
    run = lambda scenario, preload: app_with_dump("e2e_resource_app", scenario, preload)
    got = same_as_without(run, "closed_fds", None, ["a.txt: 10 bytes, as written, offset 10",
                                                    "b.txt: 10 bytes, as written, offset 10"])
    check(got.reasons(0)[:1] == ["peer_request"], f"closed_fds: the dump was written: {got.reasons(0)}")
    same_as_without(plain, "oom_exit", "exited with code 12", ["out of memory"])


@case
def dump_leaves_other_threads_sleeping():
    # An on-demand dump signals only the threads whose native stacks a report shows (the main
    # thread, the threads that call NCCL): a thread that never calls NCCL sleeps in full.
    j, ending = signal_app("sleeper", preload=True)
    check("sleeper slept in full" in j.out, f"the sleeper's sleep was not cut short: {j.out!r}")
    d = j.first(0, "on_demand")
    notes = [t["note"] for t in d["threads"] if not t["own"] and t["tid"] != d["summary"]["pid"]]
    check(any("not sampled" in n for n in notes), f"the sleeper is listed, not sampled: {notes}")
    main = [t for t in d["threads"] if t["tid"] == d["summary"]["pid"]]
    check(main and main[0]["frames"], f"the main thread's stack is sampled: {main}")


@case
def fatal_signal_dumps_and_keeps_status():
    j = job(3, ["--iters", "20"], env={"NCCLWATCH_TIMEOUT": "600",
                                        "NCCLWATCH_SIM_FAULT": "crash:rank=1,seq=5,signal=SEGV"}, timeout=8)
    d = j.first(1, "fatal_signal")
    check("SIGSEGV" in d["summary"]["detail"], d["summary"]["detail"])
    check("rank 1 killed by SIGSEGV" in j.err, f"rank 1 still died of SIGSEGV:\n{j.err[-1500:]}")


@case
def crash_frame_named_at_the_faulting_instruction():
    # A fault on the first instruction of a static function: the interrupted frame's address is
    # that instruction (not a return address), so the dump and the report name the function.
    j, ending = signal_app("segv_first_byte", True)
    check(ending and "SIGSEGV" in ending[0], f"it died of SIGSEGV: {ending}\n{j.err[-1500:]}")
    d = j.first(0, "fatal_signal")
    frames = [f for t in d["threads"] for f in t.get("frames", [])]
    named = [f for f in frames if f.get("symbol") == "corrupt_batch"]
    check(named, f"a frame names corrupt_batch: {[f.get('symbol') for f in frames][:40]}")
    check(named[0].get("interrupted") is True and named[0]["offset"] == 0,
          f"the faulting instruction, looked up as it is: {named[0]}")
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", "--no-color", j.dir], capture_output=True,
                       text=True)
    check("corrupt_batch" in r.stdout, f"the report names it:\n{r.stdout[-3000:]}")


@case
def on_demand_signal_dumps_and_continues():
    def poke(p):
        for pid in ranks_catching(p, 2, signal.SIGUSR2):
            os.kill(pid, signal.SIGUSR2)
    j = job(2, ["--iters", "10", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "2500"], timeout=20,
            after_start=poke)
    check(j.rc == 0 and j.out.count("ok") == 2, f"the job went on and finished: {j.rc} {j.err[-1500:]}")
    for r in range(2):
        j.first(r, "on_demand")


@case
def exit_with_inflight_dumps():
    j = job(2, ["--iters", "3", "--exit-in-flight"], timeout=20)
    check(j.rc == 0, f"exit status unchanged: {j.rc} {j.err[-1500:]}")
    for r in range(2):
        d = j.first(r, "exit_in_flight")
        check(d["summary"]["in_flight"], "the operation in flight is in the dump")


@case
def nccl_error_dumps():
    j = job(3, ["--iters", "10"], env={"NCCLWATCH_SIM_FAULT": "error:rank=1,seq=3", "NCCLWATCH_TIMEOUT": "600"},
            timeout=8)
    d = j.first(1, "nccl_error")
    check("returned 2" in d["summary"]["detail"], d["summary"]["detail"])


def only_exit_records(j, what):
    """A healthy run: each rank's exit record, nothing else."""
    reasons = {r: j.reasons(r) for r in j.dumps()}
    check(all(v == ["exit"] for v in reasons.values()), f"{what}: exit records only: {reasons}")
    return [ds[0]["summary"] for ds in j.dumps().values()]


@case
def graph_capture_untouched():
    j = job(4, ["--graph", "--iters", "30"], timeout=30)
    check(j.rc == 0 and j.out.count("ok") == 4, f"capture and replay work with ncclwatch loaded: {j.err[-2000:]}")
    # The captured all-reduce counts as reached and completed: replays launch it.
    for s in only_exit_records(j, "nothing to dump"):
        check(all(c["last_completed"] == c["last_enqueued"] for c in s["comms"]), f"captured ops completed: {s['comms']}")


@case
def nonblocking_followed():
    j = job(3, ["--nonblocking", "--iters", "30", "--comms", "2"], timeout=30)
    check(j.rc == 0 and j.out.count("ok") == 3, f"non-blocking communicators work: {j.err[-2000:]}")
    only_exit_records(j, "no false stall")
    j = job(3, ["--nonblocking", "--iters", "10", "--slow-kernel-rank", "1", "--slow-kernel-at", "3",
                "--slow-kernel-ms", "-1"], env={"NCCLWATCH_TIMEOUT": "3"}, timeout=10)
    s = stalled(j.first(1, "stall"))
    check(s["seq"] == 4 and s["state"] == "enqueued", f"followed after ncclInProgress: {s}")


@case
def groups_and_p2p():
    j = job(4, [], program="sim_p2p_ring", timeout=30)
    check(j.rc == 0, f"a send/recv ring in a group works under ncclwatch: {j.err[-2000:]}")
    # Both ranks send first, outside a group: each GPU sits in its send, the receive queued behind it.
    j = job(2, ["--iters", "4", "--p2p-deadlock"], env={"NCCLWATCH_TIMEOUT": "3"}, timeout=10)
    for r in (0, 1):
        d = j.first(r, "stall")
        peer = 1 - r
        s = stalled(d)
        check(s["op"] == "Send" and s["peer"] == peer and s["p2p_seq"] == 1 and s["state"] == "gpu_reached",
              f"rank {r}: the stalled operation is its first send, inside the GPU: {s}")
        p2p = world_comm(d)["p2p"]
        check(any(p["peer"] == peer and p["send_enqueued"] == 1 and p["send_completed"] == 0 for p in p2p),
              f"rank {r}: one send to {peer}, not completed: {p2p}")
        check(any(o["op"] == "Recv" and o["peer"] == peer for o in d["summary"]["in_flight"]),
              f"rank {r}: its receive is queued behind the send")


@case
def split_ids_match_across_ranks():
    j = job(4, ["--iters", "6", "--comms", "3", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "3000"],
            env={"NCCLWATCH_TIMEOUT": "1"}, timeout=20)
    check(j.rc == 0, f"job recovered and finished: {j.err[-2000:]}")
    comms = {}
    for r, ds in j.dumps().items():
        d = next(x for x in ds if "communicators" in x)
        splits = [c for c in d["communicators"] if c["parent"] is not None]
        comms[r] = {("world", 0): next(c["id"] for c in d["communicators"] if c["parent"] is None)}
        comms[r].update({("split", i, c["color"]): c["id"] for i, c in enumerate(splits)})
    check(sorted(comms) == [0, 1, 2, 3], f"all ranks dumped: {sorted(comms)}")
    world = {comms[r][("world", 0)] for r in comms}
    check(len(world) == 1, f"one world id on every rank: {world}")
    # Communicator k splits with color rank % (k+1): ranks with the same color share the id.
    for r in comms:
        for q in comms:
            for key in comms[r]:
                if key in comms[q] and key[0] == "split":
                    check(comms[r][key] == comms[q][key], f"split {key}: ranks {r} and {q} agree")
    ids = {v for c in comms.values() for v in c.values()}
    check(len(ids) == 1 + 2 + 3, f"distinct ids for distinct communicators: {len(ids)}")


@case
def stall_then_recovery():
    # Rank 0 is 4 s late, the deadline is 1 s: a stall, then a recovery record; the job finishes.
    j = job(2, ["--iters", "10", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "4000"],
            env={"NCCLWATCH_TIMEOUT": "1"}, timeout=30)
    check(j.rc == 0 and j.out.count("ok") == 2, f"a stall is a report, not a kill: {j.rc} {j.err[-1500:]}")
    d = j.first(1, "recovery")
    rec = d["recoveries"]
    check(rec and rec[0]["seq"] == 4 and rec[0]["op"] == "AllReduce", f"the recovery names the operation: {rec}")
    check(3.0 <= rec[0]["recovered_after_s"] <= 6.0, f"and after how long: {rec[0]['recovered_after_s']}")
    check(any("recovery: AllReduce seq 4" in l for l in j.ncclwatch_lines()), "one line says it recovered")


@case
def run_wrapper():
    nw = os.path.join(B, "bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    # The exit status is the command's, whatever it is; LD_PRELOAD is prepended, not replaced.
    r = subprocess.run([nw, "run", "--", "sh", "-c", "echo \"$LD_PRELOAD|$NCCLWATCH_DIR\"; exit 3"],
                       env=dict(base, LD_PRELOAD="libm.so.6"), cwd=tmp, capture_output=True, text=True)
    check(r.returncode == 3, f"exit status 3 kept ({r.returncode}): {r.stderr}")
    pre, d = r.stdout.strip().split("|")
    check(pre.endswith("libncclwatch.so:libm.so.6"), f"ours first, the existing value kept: {pre}")
    check(os.path.basename(d).startswith("ncclwatch-"), f"a job-scoped directory: {d}")
    r = subprocess.run([nw, "run", "--", "sh", "-c", "kill -TERM $$"], env=base, cwd=tmp, capture_output=True)
    check(r.returncode == -signal.SIGTERM, f"death by signal kept: {r.returncode}")
    # A hang: dumps land in --dir and the verdict is printed after the job.
    dumps = os.path.join(tmp, "dumps")
    r = subprocess.run([nw, "run", "--dir", dumps, "--timeout", "3", "--set", "PEER_POLL_MS=200", "--",
                        os.path.join(B, "bin", "simlaunch"), "-n", "2", "--timeout", "8", "--",
                        os.path.join(B, "bin", "sim_workload"), "--iters", "20", "--busy-rank", "1", "--busy-at", "4",
                        "--busy-ms", "-1"], env=base, cwd=tmp, capture_output=True, text=True)
    check(r.returncode == 124, f"the launcher's timeout status is kept ({r.returncode})")
    check(glob.glob(os.path.join(dumps, "rank*.json")), "dumps in --dir")
    check("rank_missing" in r.stdout and "rank 1" in r.stdout, f"the verdict is printed:\n{r.stdout[-2000:]}")
    # ... while the job runs (the launcher's timeout ends it 8 s in; the verdict came before),
    # and not a second time at the end: nothing changed.
    check("while the job runs" in r.stderr, f"the verdict came while the job ran:\n{r.stderr[-2000:]}")
    check(r.stdout.count("rank_missing") == 1 or "no change since the report above" in r.stderr,
          f"one report per story:\n{r.stderr[-1500:]}")
    check("process(es) watched" in r.stderr, f"one line on what was watched:\n{r.stderr[-1000:]}")
    # A healthy job: no dump, no analysis.
    r = subprocess.run([nw, "run", "--dir", os.path.join(tmp, "ok"), "--", os.path.join(B, "bin", "simlaunch"), "-n",
                        "2", "--", os.path.join(B, "bin", "sim_workload"), "--iters", "5"], env=base, cwd=tmp,
                       capture_output=True, text=True)
    check(r.returncode == 0 and "analysis" not in r.stderr + r.stdout, f"nothing to analyze: {r.stderr}")
    r = subprocess.run([nw, "run", "--bogus"], env=base, capture_output=True, text=True)
    check(r.returncode == 2 and "unknown option '--bogus'" in r.stderr, f"bad usage: one clear line: {r.stderr}")
    # Options are checked before anything starts: nothing runs, one line each, exit 2.
    marker = os.path.join(tmp, "ran")
    for bad, says in ((["--timeout", "abc"], "NCCLWATCH_TIMEOUT='abc'"), (["--set", "FOO=1"], "unknown setting NCCLWATCH_FOO"),
                      (["--set", "RING=x"], "NCCLWATCH_RING='x'")):
        r = subprocess.run([nw, "run"] + bad + ["--", "touch", marker], env=base, capture_output=True, text=True)
        check(r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1 and not os.path.exists(marker),
              f"{bad}: refused before starting, one line: {r.returncode} {r.stderr}")


@case
def run_prints_no_live_verdict_after_recovery():
    # Ranks 0 and 2 stall (deadline 1 s) while rank 1 is busy 3 s, then recover. Nobody answers
    # requests (peer polls a minute apart), so `ncclwatch run` reports the episode after its
    # settling time, when the recoveries are in: no live verdict for a stall its own dumps show
    # recovered. Then the same dumps, replayed into a run's directory as a loaded machine can
    # bring them: both stalls, but only rank 0's recovery (the collective completed, so rank 2's
    # stall is over too): still no live verdict. The end tells the stall either way.
    nw = os.path.join(B, "bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    base["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(tmp, "boxes")
    os.makedirs(base["NCCLWATCH_BLACKBOX_DIR"])

    def run(dumps, command):
        r = subprocess.run([nw, "run", "--dir", dumps, "--timeout", "1", "--set", "PEER_POLL_MS=60000", "--"] + command,
                           env=base, cwd=tmp, capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"the job finished: {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}")
        check("while the job runs" not in r.stderr, f"no live verdict for a recovered stall:\n{(r.stdout + r.stderr)[-4000:]}")
        final = r.stdout[r.stdout.rfind("ncclwatch analyze:"):]
        check("stall_recovered" in final, f"the end tells the stall:\n{final[-3000:]}")
    dumps = os.path.join(tmp, "d")
    run(dumps, [os.path.join(B, "bin", "simlaunch"), "-n", "3", "--timeout", "60", "--",
                os.path.join(B, "bin", "sim_workload"), "--iters", "10", "--busy-rank", "1", "--busy-at", "3",
                "--busy-ms", "3000", "--linger-ms", "4000"])
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(dumps, "rank*.json")))
    replay = [n for n in names if n.startswith("rank00000-") and n.endswith(("-stall.json", "-recovery.json"))] + \
        [n for n in names if n.startswith("rank00002-") and n.endswith("-stall.json")]
    check(len(replay) == 3, f"rank 0's stall and recovery, rank 2's stall: {names}")
    again = os.path.join(tmp, "again")
    os.makedirs(again)
    # The replayed dumps become the second run's own: a run reads only its job's dumps (its
    # NCCLWATCH_RUN_ID, which its command inherits, in place of the first run's).
    first = json.load(open(os.path.join(dumps, replay[0])))["summary"]["job_instance"]
    check(first.startswith("run-"), f"the first run named its job: {first!r}")
    copy = 'sleep 1; for f in "$@"; do sed "s#' + first + '#$NCCLWATCH_RUN_ID#g" "$f" > ' + again + '/.t && mv ' + \
        again + '/.t ' + again + '/"$(basename "$f")"; done; sleep 8'
    run(again, ["sh", "-c", copy, "sh"] + [os.path.join(dumps, n) for n in replay])


@case
def recovered_stall_is_no_hang():
    # Rank 1 is busy 6 s at iteration 10, the deadline is 2 s: rank 0 stalls, rank 1 answers
    # its request, then the collective completes (a recovery dump) and the job finishes. No
    # verdict after the recovery, none at the end; the end tells the stall and whom it waited for.
    nw = os.path.join(B, "bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    dumps = os.path.join(tmp, "d")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    r = subprocess.run([nw, "run", "--dir", dumps, "--timeout", "2", "--set", "PEER_POLL_MS=200", "--",
                        os.path.join(B, "bin", "simlaunch"), "-n", "2", "--timeout", "60", "--",
                        os.path.join(B, "bin", "sim_workload"), "--iters", "30", "--busy-rank", "1", "--busy-at", "10",
                        "--busy-ms", "6000"], env=base, cwd=tmp, capture_output=True, text=True, timeout=120)
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


@case
def help_texts_print_as_written():
    # Usage texts printed with fputs or as a %s argument keep their characters: no printf escapes.
    for program in ("sim_workload", "simlaunch", "ncclwatch"):
        r = subprocess.run([os.path.join(B, "bin", program), "--help"], capture_output=True, text=True)
        text = r.stdout + r.stderr
        check(r.returncode == 0 and text.strip(), f"{program} --help: exit {r.returncode}")
        check("%%" not in text, f"{program} --help prints '%%':\n{text}")
    r = subprocess.run([os.path.join(B, "bin", "sim_workload"), "--help"], capture_output=True, text=True)
    check("color = rank % (k+1)" in r.stdout, f"the modulo reads as one: {r.stdout}")


@case
def c_example_gives_its_promised_verdict():
    # examples/README.md: HANG_RANK=1 ncclwatch run -- simlaunch -n 4 -- example_allreduce gives
    # rank_missing, culprit rank 1 (with a shorter deadline and a launcher time limit here).
    nw = os.path.join(B, "bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    r = subprocess.run([nw, "run", "--dir", os.path.join(tmp, "d"), "--timeout", "3", "--set", "PEER_POLL_MS=200",
                        "--", os.path.join(B, "bin", "simlaunch"), "-n", "4", "--timeout", "12", "--",
                        os.path.join(B, "bin", "example_allreduce")],
                       env=dict(base, HANG_RANK="1", NCCL_ID_FILE=os.path.join(tmp, "id")), cwd=tmp,
                       capture_output=True, text=True, timeout=120)
    check("rank_missing  rank 1 never entered AllReduce" in r.stdout,
          f"the promised verdict:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")


@case
def run_reports_a_healthy_stop():
    # A healthy job with a straggler, stopped by SIGTERM (a time limit): the ranks' signal dumps
    # come in while the launcher still runs; that analysis is not news then (no hang), so it is
    # printed at the end: "no hang" and the slow rank, never "no change since the report above"
    # with no report above.
    nw = os.path.join(B, "bin", "ncclwatch")
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    r = subprocess.run([nw, "run", "--dir", os.path.join(tmp, "d"), "--timeout", "600", "--",
                        os.path.join(B, "bin", "simlaunch"), "-n", "4", "--timeout", "5", "--",
                        os.path.join(B, "bin", "sim_workload"), "--iters", "1000000", "--straggler-rank", "3",
                        "--straggler-ms", "20", "--straggler-max-ms", "40"], env=base, cwd=tmp, capture_output=True,
                       text=True, timeout=120)
    check(r.returncode == 124, f"the launcher's timeout status is kept ({r.returncode}):\n{r.stderr[-2000:]}")
    check("stopped or snapshotted while healthy" in r.stdout, f"the report is printed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    check("slow_rank  rank 3" in r.stdout, f"with the straggler:\n{r.stdout[-2000:]}")
    check("no change since" not in r.stderr, f"no 'no change' without a report above:\n{r.stderr[-2000:]}")
    check("process(es) watched" in r.stderr, f"one line on what was watched:\n{r.stderr[-1000:]}")


# ---------------------------------------------------------------------------------------------
# `ncclwatch analyze` on the dumps of real jobs: every cause, its culprits and sequence number.

def analyze(j):
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", "--json", j.dir], capture_output=True,
                       text=True)
    try:
        report = json.loads(r.stdout)
    except ValueError:
        raise Failure(f"analyze printed no JSON (exit {r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
    text = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", "--no-color", j.dir], capture_output=True,
                          text=True).stdout
    return r.returncode, report, text


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
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", j.dir, "--json"], capture_output=True, text=True)
    check(r.returncode in (0, 1), f"analyze ran: {r.returncode} {r.stderr[-1500:]}")
    report = json.loads(r.stdout)
    return report, report["findings"]


@case
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
    text = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", j.dir, "--no-color"], capture_output=True,
                          text=True)
    check(text.returncode == 0, "a finding does not change the exit status")
    check("slow_rank  rank 3" in text.stdout and "Also noticed" in text.stdout, text.stdout)


@case
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


@case
def slow_rank_below_a_hang():
    j = job(8, ["--iters", "200", "--straggler-rank", "2", "--straggler-ms", "20", "--straggler-max-ms", "40",
                "--busy-rank", "5", "--busy-at", "40", "--busy-ms", "-1"], env={"NCCLWATCH_TIMEOUT": "3"}, timeout=12)
    report, found = findings(j)
    v = report["verdicts"][0]
    check(v["cause"] == "rank_missing" and v["culprit_ranks"] == [5], f"the hang leads: {v['cause']} {v['culprit_ranks']}")
    check([f["rank"] for f in found] == [2], f"the straggler is a finding below it: {found}")
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", j.dir, "--no-color"], capture_output=True, text=True)
    check(r.returncode == 1, "the exit status is the hang's")
    check(r.stdout.index("rank_missing") < r.stdout.index("slow_rank"), "verdicts first, findings after")


@case
def analyze_rank_missing():
    j = job(4, ["--iters", "20", "--busy-rank", "2", "--busy-at", "5", "--busy-ms", "-1"], env=STALL, timeout=9)
    v, text = expect_verdict(j, "rank_missing", [2], seq=6, op="AllReduce")
    check(sorted(v["waiting_ranks"]) == [0, 1, 3], f"waiting ranks: {v['waiting_ranks']}")
    where = json.dumps(v["culprit_stacks"]["2"])
    check("main" in where, f"the culprit's current stack is shown: {where[:500]}")


@case
def analyze_gpu_not_reached():
    j = job(4, ["--iters", "20", "--slow-kernel-rank", "1", "--slow-kernel-at", "5", "--slow-kernel-ms", "-1"],
            env=STALL, timeout=9)
    expect_verdict(j, "gpu_not_reached", [1], seq=6, op="AllReduce")


@case
def analyze_stuck_in_collective():
    j = job(4, ["--iters", "20"], env=dict(STALL, NCCLWATCH_SIM_FAULT="stall:rank=1,seq=4"), timeout=9)
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
    j = job(2, ["--iters", "4", "--p2p-deadlock"], env=STALL, timeout=8)
    v, text = expect_verdict(j, "p2p_unmatched", [0, 1])
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


# ---------------------------------------------------------------------------------------------
# Bad input: one line, defaults, nothing lost.

@case
def invalid_env_one_line():
    j = job(2, ["--iters", "5"], env={"NCCLWATCH_RING": "abc", "NCCLWATCH_TIMEOUT": "AllGathr=5"})
    check(j.rc == 0, f"job unaffected: {j.err[-1500:]}")
    ring = [l for l in j.ncclwatch_lines() if "NCCLWATCH_RING='abc'" in l]
    tmo = [l for l in j.ncclwatch_lines() if "NCCLWATCH_TIMEOUT='AllGathr=5'" in l]
    check(len(ring) == 2 and len(tmo) == 2, f"one line per rank and variable:\n{j.err}")
    check("default" in ring[0] and "unknown operation" in tmo[0], f"says what and which default:\n{ring[0]}\n{tmo[0]}")


@case
def settings_said_in_one_line():
    # A path beyond PATH_MAX (the reason must survive the cut and no directory stay behind), a
    # misspelt variable, and signals the C library keeps.
    long_dir = "/".join(["d" * 20] * 460)
    j = job(2, ["--iters", "10", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "2500"],
            env={"NCCLWATCH_DIR": long_dir, "NCCLWATCH_TIMEOUT": "1", "NCCLWATCH_TIMOUT": "30",
                 "NCCLWATCH_STACK_SIGNAL": "32", "NCCLWATCH_DUMP_SIGNAL": "33"}, timeout=20)
    check(j.rc == 0, f"job unaffected: {j.err[-1500:]}")
    lines = j.ncclwatch_lines()
    said = lambda *parts: sum(all(p in l for p in parts) for l in lines)
    check(said("unknown variable NCCLWATCH_TIMOUT, did you mean NCCLWATCH_TIMEOUT?") == 2, f"one line per rank:\n{j.err}")
    check(said("NCCLWATCH_STACK_SIGNAL='32'", "reserved by the C library") == 2, f"stack signal:\n{j.err}")
    check(said("NCCLWATCH_DUMP_SIGNAL='33'", "reserved by the C library") == 2, f"dump signal:\n{j.err}")
    check(said("cannot write dump directory", "bytes)", "File name too long") >= 1, f"the reason survives:\n{j.err}")
    check(not os.path.exists(os.path.join(j.tmp, "d" * 20)), "a failed mkdir -p leaves no directory behind")


@case
def unwritable_dir_falls_back():
    j = job(2, ["--iters", "10", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "2500"],
            env={"NCCLWATCH_DIR": "/proc/ncclwatch-nope", "NCCLWATCH_TIMEOUT": "1"}, timeout=20)
    check(j.rc == 0, f"job unaffected: {j.err[-1500:]}")
    check(any("cannot write dump directory '/proc/ncclwatch-nope'" in l for l in j.ncclwatch_lines()),
          f"one line says what and where:\n{j.err}")
    fallback = glob.glob(os.path.join(j.tmp, "ncclwatch-*", "rank*.json"))
    check(fallback, "dumps went to the default directory instead")


@case
def max_dumps_bounded():
    j = job(2, ["--iters", "10", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "2500"],
            env={"NCCLWATCH_MAX_DUMPS": "1", "NCCLWATCH_TIMEOUT": "1"}, timeout=20)
    for r, ds in j.dumps().items():
        counted = [d for d in ds if d["summary"]["reason"] != "exit"]  # the exit record is outside the bound
        check(len(counted) <= 1, f"rank {r} wrote {len(counted)} dumps with NCCLWATCH_MAX_DUMPS=1")
    limit_lines = [l for l in j.ncclwatch_lines() if "NCCLWATCH_MAX_DUMPS=1 reached" in l]
    check(len(limit_lines) <= 2, f"the limit is said once per process at most:\n{j.err}")

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
    for args, env in ((["--iters", "20", "--slow-kernel-rank", "2", "--slow-kernel-at", "5", "--slow-kernel-ms", "-1"],
                       {"NCCLWATCH_TIMEOUT": "3"}),
                      (["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "6000"],
                       {"NCCLWATCH_TIMEOUT": "2"})):
        j = job(4, args, env=env, timeout=14)
        real += [d for ds in j.dumps().values() for d in ds]
    reasons = {d["summary"]["reason"] for d in real}
    check({"stall", "peer_request"} <= reasons, f"library dumps for a stall and a peer request: {reasons}")
    generated = []
    for scenario in ("gpu_not_reached", "rank_missing"):
        out = temp_dir("ncclwatch-gen-")
        r = subprocess.run([os.path.join(B, "bin", "ncclwatch-gen"), "--ranks", "4", "--ring", "64", "--scenario",
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

def analyze_dir(path, *extra):
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "analyze", "--json", path] + list(extra),
                       capture_output=True, text=True)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        raise Failure(f"analyze printed no JSON (exit {r.returncode}):\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")


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
            env={"NCCLWATCH_TIMEOUT": "600"}, timeout=10)
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
def live_dump_snapshot():
    # `ncclwatch dump DIR` against a running healthy job: every rank answers the request, the job
    # goes on, and the snapshot reads no_hang (exit 0).
    shared = temp_dir("ncclwatch-e2e-live-")
    result = {}

    def snapshot(p):
        ranks_catching(p, 4, signal.SIGTERM)  # the library runs in every rank: it watches the directory
        r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "dump", shared, "--json", "--wait", "10"],
                           capture_output=True, text=True)
        result["rc"], result["out"], result["err"] = r.returncode, r.stdout, r.stderr
        result["alive"] = p.poll() is None

    job(4, ["--iters", "1000000"], env={"NCCLWATCH_DIR": shared, "NCCLWATCH_TIMEOUT": "600"}, timeout=8,
        after_start=snapshot)
    check("4/4 ranks answered" in result["err"], f"every rank answered: {result['err'][-1500:]}")
    check(result["alive"], "the job went on after the snapshot")
    report = json.loads(result["out"])
    check(result["rc"] == 0 and report["verdicts"][0]["cause"] == "no_hang",
          f"the snapshot of a healthy job is no_hang (exit {result['rc']}):\n{result['out'][:1500]}")
    a_file = os.path.join(shared, "dump-request.json")
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "dump", a_file], capture_output=True, text=True)
    check(r.returncode == 2 and r.stderr.count("\n") == 1 and a_file in r.stderr,
          f"not a directory: one line with the path, exit 2: {r.stderr}")
    nobody = os.path.join(temp_dir("ncclwatch-e2e-nobody-"), "typo")
    r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "dump", nobody, "--wait", "1"], capture_output=True,
                       text=True)
    check(r.returncode == 2 and "no rank answered" in r.stderr and not os.path.exists(nobody),
          f"nobody there: exit 2, and the directory it created is gone again: {r.stderr}")


@case
def live_dump_creates_the_directory():
    # A job preloaded by hand with NCCLWATCH_DIR set, which has dumped nothing yet (the library
    # creates the directory at its first dump): `ncclwatch dump DIR` creates it, and the ranks,
    # polling that path, answer.
    shared = os.path.join(temp_dir("ncclwatch-e2e-live-"), "not-yet")
    result = {}

    def snapshot(p):
        ranks_catching(p, 2, signal.SIGTERM)
        result["existed"] = os.path.exists(shared)
        r = subprocess.run([os.path.join(B, "bin", "ncclwatch"), "dump", shared, "--json", "--wait", "20"],
                           capture_output=True, text=True)
        result["rc"], result["out"], result["err"] = r.returncode, r.stdout, r.stderr

    job(2, ["--iters", "1000000"], env={"NCCLWATCH_DIR": shared, "NCCLWATCH_TIMEOUT": "600"}, timeout=15,
        after_start=snapshot)
    check(not result["existed"], "the premise: nothing had created the directory")
    check(result["rc"] == 0 and "2/2 ranks answered" in result["err"],
          f"the directory was created and every rank answered (exit {result['rc']}): {result['err'][-1500:]}")

PROM_LINE = re.compile(r'^(ncclwatch_[a-z_]+)\{((?:[a-z_]+="[^"\\]*",?)*)\} (-?[0-9.e+]+)$')


def check_prometheus_text(text):
    """The text exposition format as node-exporter's textfile collector reads it; promtool's
    own check too where it is installed (Debian package prometheus)."""
    helped, typed = set(), {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helped.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
        else:
            m = PROM_LINE.match(line)
            check(m, f"a sample line: {line!r}")
            name = m.group(1)
            check(name in helped and name in typed, f"{name} has HELP and TYPE before its samples")
            check(typed[name] != "counter" or name.endswith("_total"), f"counter {name} ends in _total")
            check("rank=" in m.group(2), f"every sample has the rank label: {line}")
            samples.append((name, m.group(2), float(m.group(3))))
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        check(r.returncode == 0, f"promtool check metrics: {r.stdout} {r.stderr}")
    else:
        print("  promtool not installed: checked against the format's rules only")
    return samples


@case
def metrics_textfile():
    # NCCLWATCH_METRICS=DIR: each process keeps a Prometheus file there while it runs, and removes
    # it when it exits normally.
    # A directory that does not exist yet (a textfile collector's, before its first writer): created.
    metrics = os.path.join(temp_dir("ncclwatch-e2e-metrics-"), "node-exporter", "textfile")
    seen = {}

    def all_counted():
        # Both files, each past the 300 all-reduces (the job lingers 7 s after them).
        texts = {path: read_text(path) for path in glob.glob(os.path.join(metrics, "*.prom"))}
        done = [max([float(v) for v in re.findall(r"^ncclwatch_collectives_completed_total\{.*\} (\S+)$", t, re.M)]
                    or [0]) for t in texts.values()]
        return len(texts) == 2 and all(d >= 300 for d in done) and texts

    def sample(p):
        seen.update(wait_for(all_counted, "two metrics files counting 300 all-reduces"))

    j = job(2, ["--iters", "300", "--linger-ms", "7000"], env={"NCCLWATCH_METRICS": metrics}, timeout=30,
            after_start=sample)
    check(j.rc == 0, f"the job finished: {j.rc} {j.err[-1500:]}")
    check(len(seen) == 2, f"one file per process while it ran: {list(seen)}")
    for path, text in seen.items():
        samples = check_prometheus_text(text)
        ops = [v for n, l, v in samples if n == "ncclwatch_operations_total" and 'op="AllReduce"' in l]
        check(ops and max(ops) >= 300, f"{path}: the all-reduces are counted: {ops}")
        done = [v for n, l, v in samples if n == "ncclwatch_collectives_completed_total"]
        check(done and max(done) >= 300, f"{path}: completions counted: {done}")
    check(glob.glob(os.path.join(metrics, "*")) == [], f"files removed at exit: {os.listdir(metrics)}")

@case
def metrics_removed_when_a_signal_ends_the_job():
    # The launcher's SIGTERM ends the ranks (after their dumps): their metrics files go with them,
    # or the collector would show dead processes as alive.
    metrics = temp_dir("ncclwatch-e2e-metrics-")

    def wait_files(p):
        wait_for(lambda: len(glob.glob(os.path.join(metrics, "*.prom"))) == 2, "two metrics files")
    j = job(2, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_METRICS": metrics, "NCCLWATCH_TIMEOUT": "600"}, timeout=8, after_start=wait_files)
    for r in range(2):
        check(f"rank {r} killed by SIGTERM" in j.err and "signal" in j.reasons(r), f"rank {r} dumped, then SIGTERM ended it")
    check(os.listdir(metrics) == [], f"no metrics file left: {os.listdir(metrics)}")


@case
def one_line_per_rank_per_event():
    # At 512 ranks the launcher's log is where users look: each rank says each event once, in
    # one short line (what happened and the dump's file name), never the same stall twice.
    j = job(4, ["--iters", "20", "--busy-rank", "2", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    lines = j.ncclwatch_lines()
    dumps = sum(len(v) for v in j.dumps().values())
    check(len(lines) == dumps, f"one line per dump ({dumps}), no more:\n" + "\n".join(lines))
    for l in lines:
        check(len(l) < 300 and "(dump rank" in l, f"short, naming the dump: {l}")

def first_verdict(j, cause, culprits, seq=None):
    rc, report = analyze_dir(j.dir)
    v = report["verdicts"][0]
    what = json.dumps(report["verdicts"], indent=1)[:2500]
    check(rc == 1 and v["cause"] == cause and sorted(v["culprit_ranks"]) == culprits,
          f"{cause} {culprits} (exit {rc}):\n{what}\n{j.err[-1500:]}")
    if seq is not None:
        check(v["seq"] == seq, f"at #{seq}:\n{what}")
    return v


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


@case
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


@case
def mid_job_communicator_never_joined():
    # Before iteration 10 every rank creates a new communicator (a checkpoint group), except rank
    # 5, busy in host code. Each way of creating one: ncclCommInitRank / ncclCommInitRankConfig
    # per block of 4 ranks (ranks 0-3 create theirs and wait in the next world collective, 4, 6
    # and 7 wait inside the creation), ncclCommSplit and ncclCommShrink of the world (the seven
    # others all wait inside it). Only rank 5 is to blame, as the one that never joined; a blocked
    # creation is never no_hang.
    for kind, groups in (("init", "2"), ("config", "2"), ("split", "2"), ("shrink", "1")):
        j = job(8, ["--iters", "30", "--new-comm-at", "10", "--new-comm-kind", kind, "--new-comm-groups", groups,
                    "--new-comm-skip-rank", "5"], env={"NCCLWATCH_TIMEOUT": "2"}, timeout=10)
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
                "--abort-signal"], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=10)
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
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8)
    v = first_verdict(j, "rank_missing", [3])
    check(v["seq"] > 1, f"not at the captured operation (#1): #{v['seq']}")


# ---------------------------------------------------------------------------------------------
# Last words: what a rank knew survives SIGKILL (its black box, read by the host's caretaker) and
# _exit (the same exit record as exit()).

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


def files_in(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def boxes(j):
    return [f for f in files_in(os.path.join(j.tmp, "boxes")) if "ncclwatch-box-" in f]


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
    def kill_busy(p):
        dumps = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps")
        pid = rank_pid(p, 2)
        wait_for(lambda: glob.glob(os.path.join(dumps, "rank00000-*-stall.json")), "rank 0's stall dump")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: glob.glob(os.path.join(dumps, "rank00002-*-postmortem.json")), "rank 2's postmortem dump")
    j = job(4, ["--iters", "200", "--busy-rank", "2", "--busy-at", "20", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "2"}, timeout=15, after_start=kill_busy)
    v, where, text = postmortem_where(j, 2)
    check(v["seq"] == 21, f"the others wait in #21: #{v['seq']}")
    check("last seen outside NCCL" in where["where"] and "#20" in where["where"], f"where: {where['where']}")


@case
def shared_dir_other_users_cannot_jam():
    # A node-local directory every user can write to (/dev/shm's mode, 1777): another user's
    # files under the names ncclwatch would use there (the caretaker's lock as a link, a relay's
    # temporary name) change nothing: ncclwatch keeps its files in its own 0700 subdirectory, and
    # a rank SIGKILLed still gets its postmortem. That subdirectory taken by another user: one
    # line, the job goes on without it, and ends as without ncclwatch.
    other = 65534
    uid = os.getuid()
    if uid != 0:
        return  # files of another user can only be made by root
    shared = temp_dir("ncclwatch-e2e-shared-")
    os.chmod(shared, 0o1777)
    os.symlink("/etc/passwd", os.path.join(shared, f"ncclwatch-caretaker-{uid}.lock"))
    os.lchown(os.path.join(shared, f"ncclwatch-caretaker-{uid}.lock"), other, other)
    for name in (f"ncclwatch-relay-{uid}-0000000000000000.lock.tmp", f"ncclwatch-box-{uid}-1-x"):
        with open(os.path.join(shared, name), "w") as f:
            f.write("someone else's\n")
        os.chown(os.path.join(shared, name), other, other)
    env = {"NCCLWATCH_TIMEOUT": "2", "NCCLWATCH_BLACKBOX_DIR": shared, "NCCLWATCH_RELAY_DIR": shared}

    def kill_busy(p):
        dumps = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "dumps")
        pid = rank_pid(p, 1)
        wait_for(lambda: glob.glob(os.path.join(dumps, "rank00000-*-stall.json")), "rank 0's stall dump")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: glob.glob(os.path.join(dumps, "rank00001-*-postmortem.json")), "rank 1's postmortem dump")
    j = job(2, ["--iters", "200", "--busy-rank", "1", "--busy-at", "20", "--busy-ms", "-1"], env=env, timeout=15,
            after_start=kill_busy)
    check("postmortem" in j.reasons(1), f"rank 1's postmortem despite the squatter: {j.reasons(1)}\n{j.err[-1500:]}")
    mine = os.path.join(shared, f"ncclwatch-{uid}")
    st = os.lstat(mine)
    check(stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, f"{mine}: {oct(st.st_mode)}")
    check(os.path.islink(os.path.join(shared, f"ncclwatch-caretaker-{uid}.lock")), "the other user's link untouched")

    # The subdirectory itself taken by another user: refused, said once per rank, job unharmed.
    taken = temp_dir("ncclwatch-e2e-shared-")
    os.chmod(taken, 0o1777)
    os.mkdir(os.path.join(taken, f"ncclwatch-{uid}"), 0o777)
    os.chown(os.path.join(taken, f"ncclwatch-{uid}"), other, other)
    runs = {}
    for preload in (False, True):
        runs[preload] = job(2, ["--iters", "20"], env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_BLACKBOX_DIR": taken,
                                                      "NCCLWATCH_RELAY_DIR": taken}, timeout=30, preload=preload)
    got, without = runs[True], runs[False]
    check(got.rc == without.rc == 0 and got.out == without.out, f"as without ncclwatch: {got.rc} {without.rc}\n{got.err[-1500:]}")
    lines = [l for l in got.ncclwatch_lines() if f"belongs to user {other}" in l]
    check(len(lines) == 4, f"one line per rank and directory names the other user: {got.ncclwatch_lines()}")
    check(os.listdir(os.path.join(taken, f"ncclwatch-{uid}")) == [], "nothing written into the other user's directory")


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
        j = job(2, ["--iters", "200", "--busy-rank", "1", "--busy-at", "5", "--busy-ms", "-1"],
                env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_DIR": setting}, timeout=15, after_start=kill_busy)
        found = glob.glob(os.path.join(j.tmp, setting or "ncclwatch-*", "rank00001-*-postmortem.json"))
        check(found, f"NCCLWATCH_DIR={setting!r}: rank 1's postmortem in the job's directory:\n{j.err[-1500:]}")


@case
def last_words_caretaker_killed():
    # The host's caretaker itself is SIGKILLed: the next process elected converts its black box.
    def kill_caretaker(p):
        lock = os.path.join(os.path.realpath(f"/proc/{p.pid}/cwd"), "boxes", f"ncclwatch-caretaker-{os.getuid()}.lock")
        wait_for(lambda: os.path.exists(lock), "the caretaker's lock")
        inode = os.stat(lock).st_ino

        def holder():
            for line in open("/proc/locks"):
                f = line.split()
                if len(f) > 5 and f[1] == "FLOCK" and f[5].endswith(f":{inode}"):
                    return int(f[4])
            return None
        pid = wait_for(holder, "a caretaker")
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


def host_dirs():
    # A host of its own for a case about what jobs leave on it: black box and relay directories
    # that no other case uses, and the settings that point a job at them (deadline 2 s).
    shared = temp_dir("ncclwatch-e2e-host-")
    boxes_dir, relay_dir = os.path.join(shared, "boxes"), os.path.join(shared, "relay")
    os.makedirs(boxes_dir)
    os.makedirs(relay_dir)
    return boxes_dir, relay_dir, {"NCCLWATCH_BLACKBOX_DIR": boxes_dir, "NCCLWATCH_RELAY_DIR": relay_dir,
                                  "NCCLWATCH_TIMEOUT": "2"}


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


@case
def last_words_gone_before_teardown():
    # Without black boxes: rank 1 answered a request during a slow save, then was SIGKILLed; the
    # others answer the launcher's SIGTERM much later. Its old dump is not read as rank_missing.
    j = job(4, ["--iters", "400", "--busy-rank", "1", "--busy-at", "5", "--busy-ms", "3000", "--jitter-ms", "4"],
            env={"NCCLWATCH_TIMEOUT": "1", "NCCLWATCH_SIM_FAULT": "crash:rank=1,seq=60",
                 "NCCLWATCH_BLACKBOX_DIR": "none"}, timeout=16)
    check("postmortem" not in j.reasons(1) and "peer_request" in j.reasons(1), f"rank 1: {j.reasons(1)}")
    v = first_verdict(j, "rank_dead", [1])
    check("gone before the job's teardown" in v["culprit_stacks"]["1"]["where"], f"where: {v['culprit_stacks']['1']}")


# ---------------------------------------------------------------------------------------------
# Evidence that is fresh and the job's own (issue 35).

NW = lambda: os.path.join(B, "bin", "ncclwatch")


def run_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}


class RunJob:
    """`ncclwatch run [run_args] -- simlaunch -n N --timeout T -- sim_workload ARGS` in the
    background, its output in files."""

    def __init__(self, tmp, name, n, run_args, args, launcher_timeout, env=None):
        self.tmp, self.n = tmp, n
        self.out_path, self.err_path = os.path.join(tmp, name + ".out"), os.path.join(tmp, name + ".err")
        cmd = [NW(), "run"] + run_args + ["--", os.path.join(B, "bin", "simlaunch"), "-n", str(n), "--timeout",
                                          str(launcher_timeout), "--", os.path.join(B, "bin", "sim_workload")] + args
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


@case
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
    j.wait()
    err, out = j.err(), j.out()
    said = [l for l in err.splitlines() if "cannot write dump directory" in l and "instead" in l]
    check(said, f"a rank said where it writes instead:\n{err[-2000:]}")
    check("watching it there" in err, f"run followed the dumps:\n{err[-2000:]}")
    check("rank 1 never entered AllReduce" in out, f"and gave the verdict:\n{out[-2000:]}\n{err[-1500:]}")
    check("LD_PRELOAD cleared" not in err, f"no blame on the preload:\n{err[-1500:]}")


@case
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


@case
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



def main():
    global B
    assert SERIAL <= set(CASES), SERIAL - set(CASES)
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--list", action="store_true", help="the case names, one a line (CMake reads them)")
    ap.add_argument("--list-serial", action="store_true", help="the cases that must run alone")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    if a.list or a.list_serial:
        print("\n".join(c for c in CASES if a.list or c in SERIAL))
        return 0
    if not a.build:
        ap.error("--build is required")
    B = os.path.abspath(a.build)
    unknown = [c for c in a.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s): {' '.join(unknown)}")
    return run_cases(CASES, a.cases)


if __name__ == "__main__":
    sys.exit(main())

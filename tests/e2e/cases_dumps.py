"""What the library writes when a job stalls, is signalled or fails: every rank's dump, its
stacks, its ring, and the job-wide request that reaches them."""
import glob
import json
import os
import re
import signal
import subprocess
import time

from e2e_common import (built, case, job, long_case, only_exit_records, ranks_catching, ring_entries, serial_case,
                        signal_app, stalled)
from ncclwatch_testing import (all_of, check, dumped, temp_dir)


def world_comm(d):
    return max(d["summary"]["comms"], key=lambda c: c["size"])


@serial_case
def busy_rank_every_rank_dumps():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            env={"NCCLWATCH_TIMEOUT": "3"}, timeout=12, until=lambda d: dumped(d, [0, 1, 2, 3]))
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
        shown = subprocess.run([built("bin", "ncclwatch"), "show", "--json", d["_path"]],
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
            launcher_args=["--hosts", "2"], env={"NCCLWATCH_TIMEOUT": "3", "NCCLWATCH_RELAY_DIR": relay}, timeout=15,
            until=lambda d: dumped(d, range(8)))
    dumps = j.dumps()
    check(sorted(dumps) == list(range(8)), f"every rank dumped: {sorted(dumps)}\n{j.err[-1500:]}")
    j.first(0, "peer_request")
    for host, ranks in hosts.items():
        for r in ranks:
            check(dumps[r][0]["summary"]["host"] == host, f"rank {r} is on {host} (NCCLWATCH_HOST)")


@case
def relay_missing_dir_each_rank_reads():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1"],
            launcher_args=["--hosts", "2"], timeout=12, until=lambda d: dumped(d, range(4)),
            env={"NCCLWATCH_TIMEOUT": "3", "NCCLWATCH_RELAY_DIR": "/nonexistent/ncclwatch-relay"})
    lines = [l for l in j.ncclwatch_lines() if "NCCLWATCH_RELAY_DIR" in l]
    check(len(lines) == 4 and all("reads the job-wide dump request in the dump directory itself" in l for l in lines),
          f"one line per rank: {lines}")
    check(sorted(j.dumps()) == [0, 1, 2, 3], "the request still reached every rank")
    j.first(0, "peer_request")


@serial_case
def adaptive_deadline_within_15s():
    # No NCCLWATCH_TIMEOUT: with millisecond collectives the adaptive deadline applies.
    j = job(4, ["--iters", "400", "--busy-rank", "0", "--busy-at", "150", "--busy-ms", "-1"], timeout=30,
            until=lambda d: dumped(d, [1], ["stall"]))
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
            env={"NCCLWATCH_TIMEOUT": "3"}, timeout=12, until=lambda d: dumped(d, range(4), ["stall"]))
    s2 = stalled(j.first(2, "stall"))
    check(s2["seq"] == 6 and s2["state"] == "enqueued", f"rank 2's GPU never reached seq 6: {s2}")
    for r in (0, 1, 3):
        s = stalled(j.first(r, "stall"))
        check(s["seq"] == 6 and s["state"] == "gpu_reached", f"rank {r} waits inside seq 6: {s}")


@case
def transport_stall():
    j = job(4, ["--iters", "20"], env={"NCCLWATCH_TIMEOUT": "3", "NCCLWATCH_SIM_FAULT": "stall:rank=1,seq=4"},
            timeout=12, until=lambda d: dumped(d, range(4), ["stall"]))
    for r in range(4):
        s = stalled(j.first(r, "stall"))
        check(s["seq"] == 4 and s["state"] == "gpu_reached", f"rank {r} inside seq 4: {s}")
        check(world_comm(j.first(r, "stall"))["last_completed"] == 3, "seq 3 was the last completed")


@case
def abort_dumps_before_forwarding():
    j = job(4, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1",
                "--abort-after-ms", "2000"], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=15,
            until=lambda d: all_of(dumped(d, [1, 2, 3], ["abort"]), dumped(d, [0], ["peer_request"])))
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


@long_case(20)
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
    r = subprocess.run([built("bin", "ncclwatch"), "analyze", "--no-color", j.dir], capture_output=True,
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


@serial_case
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

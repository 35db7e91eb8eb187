#!/usr/bin/env python3
"""ncclwatch on a real GPU with PyTorch (tests/gpu/run.sh runs this; it skips without a GPU).

Each check starts fresh worker processes (this file, `worker MODE`), single-rank (world size
1), with libncclwatch.so preloaded unless said otherwise:
  ops       what the dump recorded is what NCCL itself received, found in NCCL's own debug
            log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL): the same operations, counts and
            dtypes in the same order. PyTorch calls NCCL for some operations only (at world
            size 1 its reduce_scatter calls nothing): the issued ones NCCL never saw are listed,
            not required.
  stall     torch.cuda._sleep before an all_reduce; process-group timeout 60 s, ncclwatch
            deadline 5 s: the dump exists before PyTorch's watchdog kills the process, and
            `ncclwatch analyze` says gpu_not_reached with this script's line
  graph     an all_reduce captured into a CUDA graph and replayed: capture works, results right
  speed     10,000 small all_reduces, processes alternated 3 times each without the library,
            with NCCLWATCH_DISABLE=1 and with the library: the medians and their ratio
  overlap   CUDA_DEVICE_MAX_CONNECTIONS=1: a 256 MiB all_gather (at one rank, a copy on the
            communication stream) issued beside 20 matmuls on another stream; the time of the
            two together, processes alternated 3 times each, is no longer with the library
            than without (5 %). The same with timing events (NCCLWATCH_GPU_TIMING=1) is shown
            beside it: what a marker that serializes the streams would cost.
  ddp       a small DDP model (bucketed all-reduces issued from the autograd thread) under
            `ncclwatch run -- torchrun --nproc-per-node 1`, a GPU sleep before backward() at
            step 20: run's live verdict says gpu_not_reached with the backward() line within
            the 5 s deadline plus 15 s.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ----------------------------------------------------------------------------- workers

def ddp_worker(torch, dist):
    """Under torchrun (its variables): DDP's bucketed all-reduces, issued from the autograd
    thread; at step STEP the GPU sleeps before backward(), so it never reaches them."""
    from torch.nn.parallel import DistributedDataParallel
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
    ddp = DistributedDataParallel(model, bucket_cap_mb=4)  # several buckets per backward
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device="cuda")
    for step in range(100000):
        loss = ddp(x).square().mean()
        if step == DDP_STALL_STEP:
            with open(os.environ["GPU_CHECK_MARK"], "w") as f:
                f.write(str(time.time()))
            torch.cuda._sleep(10**12)  # a kernel that outlives every deadline
        loss.backward()  # DDP-LINE: the line run's verdict must show
        opt.step()
        opt.zero_grad()
        loss.item()  # the loss logged each step, as training loops do: the host waits here


DDP_STALL_STEP = 20


def worker(mode):
    import datetime

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("nccl", rank=0, world_size=1, timeout=timeout,
                            device_id=torch.device("cuda:0"))
    torch.cuda.set_device(0)
    dev = "cuda"
    if mode == "ops":
        # Each call is what PyTorch may or may not hand to NCCL; check_ops compares NCCL's own
        # log with the dump.
        a = torch.ones(1000, device=dev, dtype=torch.float32)
        dist.all_reduce(a)
        b = torch.arange(10, device=dev, dtype=torch.int64)
        dist.broadcast(b, src=0)
        g_in = torch.ones(2048, device=dev, dtype=torch.bfloat16)
        g_out = torch.empty(2048, device=dev, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(g_out, g_in)
        t_in = torch.ones(96, device=dev, dtype=torch.float16)
        t_out = torch.empty(96, device=dev, dtype=torch.float16)
        dist.all_to_all_single(t_out, t_in)
        dist.barrier()
        r_in = torch.ones(512, device=dev, dtype=torch.float16)
        r_out = torch.empty(512, device=dev, dtype=torch.float16)
        dist.reduce_scatter_tensor(r_out, r_in)
        torch.cuda.synchronize()
        os.kill(os.getpid(), signal.SIGUSR2)  # on-demand dump; the job goes on
        time.sleep(3)
        print("ops done", flush=True)
    elif mode == "stall":
        x = torch.ones(1 << 20, device=dev)
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        torch.cuda._sleep(10**12)  # a kernel that outlives every deadline
        dist.all_reduce(x)  # STALL-LINE: the line analyze must show
        torch.cuda.synchronize()
    elif mode == "graph":
        x = torch.ones(4096, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(x)
        for i in range(5):
            x.fill_(i + 1.0)
            g.replay()
            torch.cuda.synchronize()
            assert bool((x == i + 1.0).all()), f"replay {i}: wrong result"
        print("graph ok", flush=True)
    elif mode in ("graph_watch", "graph_speed"):
        # Issue 47: a captured all_reduce is watched at every replay. graph_watch: the graph's
        # first kernel never ends in replay 2, so the dump shows the all_reduce launched (replays
        # seen) and not reached. graph_speed: a captured step's time with and without the library.
        x = torch.ones(4096, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                dist.all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            if mode == "graph_watch":
                torch.cuda._sleep(10**6)  # the graph's own kernel, before the collective
            dist.all_reduce(x)
        if mode == "graph_speed":
            for _ in range(20):
                g.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(2000):
                g.replay()
            torch.cuda.synchronize()
            print(json.dumps({"seconds": time.perf_counter() - t}), flush=True)
        else:
            g.replay()
            torch.cuda.synchronize()
            time.sleep(0.5)
            torch.cuda._sleep(10**12)  # the next replay waits behind a kernel that never ends
            g.replay()
            time.sleep(3)
            os.kill(os.getpid(), signal.SIGUSR2)  # on-demand dump while the replay is launched
            time.sleep(3)
            print("graph_watch dumped", flush=True)
            os._exit(0)  # the GPU never finishes: no teardown
    elif mode == "speed":
        x = torch.ones(16, device=dev)
        for _ in range(100):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10000):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        print(json.dumps({"seconds": time.perf_counter() - t}), flush=True)
    elif mode == "overlap":
        a = torch.randn(4096, 4096, device=dev)
        g_in = torch.ones(64 << 20, device=dev)  # 256 MiB: at one rank, a copy NCCL makes
        g_out = torch.empty_like(g_in)
        comp = torch.cuda.Stream()

        def both():
            dist.all_gather_into_tensor(g_out, g_in, async_op=True)
            with torch.cuda.stream(comp):
                for _ in range(20):
                    a @ a

        def median_time(fn, reps=7):
            times = []
            for _ in range(reps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            return sorted(times)[reps // 2]

        median_time(both, 2)
        print(json.dumps({"both_s": median_time(both)}), flush=True)
    elif mode == "ddp":
        ddp_worker(torch, dist)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- checks

class Ctx:
    def __init__(self, a):
        self.lib, self.ncclwatch, self.results = a.lib, a.ncclwatch, {}

    def start(self, mode, preload=True, env=None):
        d = tempfile.mkdtemp(prefix=f"ncclwatch-gpu-{mode}-")
        e = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                 LOCAL_RANK="0", NCCLWATCH_DIR=d)
        e.pop("LD_PRELOAD", None)
        if preload:
            e["LD_PRELOAD"] = self.lib
        e.update(env or {})
        p = subprocess.Popen([sys.executable, HERE, "worker", mode], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        return p, d

    def run(self, mode, preload=True, env=None, timeout=300):
        p, d = self.start(mode, preload, env)
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err, d


def dumps(d):
    out = []
    for f in sorted(glob.glob(os.path.join(d, "rank*.json"))):
        with open(f) as fh:
            out.append(json.load(fh))
        out[-1]["_path"] = f
    return out


# NCCL's own record of a collective (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL), e.g.
# "NCCL INFO AllReduce: opCount 0 sendbuff 0x.. recvbuff 0x.. count 1000 datatype 7 op 0 root 0 ..."
NCCL_COLL = re.compile(r"NCCL INFO (\w+): opCount \w+ .*?count (\d+) datatype (\d+)")
# ncclDataType_t values as dumps name them (include/ncclwatch/trace_format.h).
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16",
          "float8e4m3", "float8e5m2"]
# What the ops worker issues, and what NCCL receives for it when PyTorch calls NCCL at all.
ISSUED = {"all_reduce": ("AllReduce", 1000, "float32"), "broadcast": ("Broadcast", 10, "int64"),
          "all_gather": ("AllGather", 2048, "bfloat16"), "reduce_scatter": ("ReduceScatter", 512, "float16")}


def nccl_received(log_dir):
    seen = []
    for f in sorted(glob.glob(os.path.join(log_dir, "nccl.*.log"))):
        for line in open(f, errors="replace"):
            m = NCCL_COLL.search(line)
            if m:
                dtype = int(m.group(3))
                seen.append((m.group(1), int(m.group(2)), DTYPES[dtype] if dtype < len(DTYPES) else str(dtype)))
    return seen


def check_ops(c):
    logs = tempfile.mkdtemp(prefix="ncclwatch-gpu-nccl-log-")
    rc, out, err, d = c.run("ops", env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL",
                                        "NCCL_DEBUG_FILE": os.path.join(logs, "nccl.%h.%p.log")})
    assert rc == 0 and "ops done" in out, f"worker failed: {err[-2000:]}"
    received = nccl_received(logs)
    assert received, f"NCCL logged no collective (NCCL_DEBUG_SUBSYS=COLL) in {logs}"
    ds = [x for x in dumps(d) if x["summary"]["reason"] == "on_demand"]
    assert ds, f"no on-demand dump in {d}"
    # `ncclwatch show --json` gives the ring as operation objects, whatever the trace version.
    shown = subprocess.run([c.ncclwatch, "show", "--json", ds[0]["_path"]], capture_output=True, text=True)
    ring = json.loads(shown.stdout)["ring"]["entries"]
    recorded = [(e["op"], e["count"], e["dtype"]) for e in ring]
    # The dump was taken after the last operation: NCCL's log up to it is the whole list.
    assert recorded == received, f"the dump recorded {recorded}\nNCCL received {received}"
    not_called = [name for name, op in ISSUED.items() if op not in received]
    comms = {e["comm"] for e in ring}
    c.results["ops"] = {"recorded": recorded, "nccl_received": received, "issued_not_called": not_called,
                        "communicators": len(comms)}
    shutil.rmtree(logs, ignore_errors=True)
    return (f"the dump holds the {len(received)} operations NCCL's log shows, in order, on {len(comms)} "
            f"communicator(s)" + (f"; PyTorch called NCCL for none of: {', '.join(not_called)}" if not_called else ""))


def check_stall(c):
    p, d = c.start("stall", env={"NCCLWATCH_TIMEOUT": "5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    t0 = time.time()
    found = None
    while time.time() - t0 < 55 and p.poll() is None:
        stalls = [x for x in dumps(d) if x["summary"]["reason"] == "stall"]
        if stalls:
            found = time.time() - t0
            break
        time.sleep(0.5)
    alive = p.poll() is None
    p.kill()
    p.communicate()
    assert found is not None, "no stall dump before PyTorch's 60 s watchdog"
    assert alive, "the process was already gone when the dump appeared"
    a = subprocess.run([c.ncclwatch, "analyze", "--no-color", d], capture_output=True, text=True)
    line = next(i for i, l in enumerate(open(HERE), 1) if "STALL-LINE" in l and "dist.all_reduce" in l)
    assert "gpu_not_reached" in a.stdout, f"analyze did not say gpu_not_reached:\n{a.stdout}"
    where = f"gpu_checks.py:{line}"
    has_line = where in a.stdout
    c.results["stall"] = {"dump_after_s": round(found, 1), "verdict": "gpu_not_reached", "script_line_shown": has_line}
    assert has_line, f"analyze did not show {where}:\n{a.stdout}"
    return f"stall dump {found:.1f} s after start (PyTorch timeout 60 s); analyze: gpu_not_reached at {where}"


def check_graph(c):
    rc, out, err, _ = c.run("graph")
    assert rc == 0 and "graph ok" in out, f"capture/replay failed with ncclwatch loaded:\n{err[-3000:]}"
    c.results["graph"] = "ok"
    return "capture succeeded, 5 replays gave the right results"


def check_graph_watch(c):
    rc, out, err, d = c.run("graph_watch", timeout=120)
    assert "graph_watch dumped" in out, f"the graph job did not get to its dump:\n{err[-3000:]}"
    on_demand = [x for x in dumps(d) if x["summary"]["reason"] == "on_demand"]
    assert on_demand, f"no on-demand dump in {d}"
    ops = [o for o in on_demand[0]["summary"]["in_flight"] if o.get("replays") is not None]
    assert ops and ops[0]["op"] == "AllReduce" and ops[0]["replays"] >= 1 and ops[0]["state"] == "enqueued", \
        f"the captured all_reduce is shown launched in a replay, not reached: {on_demand[0]['summary']['in_flight']}"
    c.results["graph_watch"] = {"replays_seen": ops[0]["replays"], "state": ops[0]["state"]}
    return f"captured all_reduce watched: replays seen {ops[0]['replays']}, state {ops[0]['state']} behind a hung kernel"


def check_graph_speed(c):
    runs = alternated(c, "graph_speed", {"without": (False, {}), "with": (True, {})})
    med = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    ratio = med["with"] / med["without"]
    c.results["graph_speed"] = {"without_s": med["without"], "with_s": med["with"], "ratio": ratio}
    return (f"2,000 replays of a captured all_reduce, medians of 3 alternated processes: {med['without']:.3f} s "
            f"without, {med['with']:.3f} s with (ratio {ratio:.3f})")


def alternated(c, mode, variants, rounds=3, env=None):
    """{variant: [figure per process]}: one process per variant per round, in turn, so that
    every variant sees the same machine. `variants`: {name: (preload, extra environment)}."""
    out = {name: [] for name in variants}
    for r in range(rounds):
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        for name in names:
            preload, extra = variants[name]
            rc, stdout, err, _ = c.run(mode, preload=preload, env=dict(env or {}, **extra))
            assert rc == 0, f"{mode} ({name}) failed:\n{err[-2000:]}"
            out[name].append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def check_speed(c):
    runs = alternated(c, "speed", {"without": (False, {}), "disabled": (True, {"NCCLWATCH_DISABLE": "1"}),
                                   "with": (True, {})})
    med = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
    ratio = med["with"] / med["without"]
    c.results["speed"] = {"without_s": med["without"], "disabled_s": med["disabled"], "with_s": med["with"],
                          "ratio": ratio, "per_process": {k: [r["seconds"] for r in v] for k, v in runs.items()},
                          "us_per_call_added": (med["with"] - med["without"]) / 10000 * 1e6}
    return (f"10,000 all_reduces, medians of 3 alternated processes: {med['without']:.3f} s without, "
            f"{med['disabled']:.3f} s disabled, {med['with']:.3f} s with (ratio {ratio:.3f}, "
            f"{(med['with'] - med['without']) / 10000 * 1e6:+.2f} us per call)")


def check_overlap(c):
    runs = alternated(c, "overlap", {"without": (False, {}), "with": (True, {}),
                                     "timing_events": (True, {"NCCLWATCH_GPU_TIMING": "1"})},
                      env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    med = {name: statistics.median(r["both_s"] for r in rs) for name, rs in runs.items()}
    c.results["overlap"] = {"without_s": med["without"], "with_s": med["with"],
                            "timing_events_s": med["timing_events"],
                            "per_process": {k: [r["both_s"] for r in v] for k, v in runs.items()}}
    summary = (f"all_gather beside matmuls, medians of 3 alternated processes: {med['without'] * 1e3:.2f} ms "
               f"without, {med['with'] * 1e3:.2f} ms with, {med['timing_events'] * 1e3:.2f} ms with timing events")
    assert med["with"] <= med["without"] * 1.05, f"the library serializes the streams: {summary}"
    return summary


def check_ddp(c):
    d = tempfile.mkdtemp(prefix="ncclwatch-gpu-ddp-")
    mark = os.path.join(d, "stalled-at")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(GPU_CHECK_MARK=mark, PYTHONUNBUFFERED="1")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-port",
                str(free_port())]
    p = subprocess.Popen([c.ncclwatch, "run", "--dir", os.path.join(d, "dumps"), "--timeout", "5", "--lib", c.lib,
                          "--"] + torchrun + [HERE, "worker", "ddp"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines, verdict_at = [], None
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)  # run's output, line by line
    reader.start()
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        if any("gpu_not_reached" in l for l in list(lines)):
            verdict_at = time.time()
            time.sleep(2)  # the rest of the verdict
            break
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGKILL)  # run, torchrun and the worker with its sleeping kernel
    p.wait()
    reader.join(timeout=5)
    text = "".join(lines)
    assert verdict_at is not None, f"no gpu_not_reached verdict from ncclwatch run:\n{text[-3000:]}"
    stalled_at = float(open(mark).read())
    after = verdict_at - stalled_at
    line = next(i for i, l in enumerate(open(HERE), 1) if "DDP-LINE" in l and "backward()" in l)
    where = f"gpu_checks.py:{line}"
    c.results["ddp"] = {"verdict_after_s": round(after, 1), "line_shown": where in text}
    assert where in text, f"the verdict does not show {where} (backward()):\n{text[-3000:]}"
    assert after <= 5 + 15, f"the verdict came {after:.1f} s after the GPU stopped (deadline 5 s)"
    shutil.rmtree(d, ignore_errors=True)
    return f"gpu_not_reached at {where} (backward()) {after:.1f} s after the GPU stopped (deadline 5 s)"


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        return worker(sys.argv[2])
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--ncclwatch", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    c = Ctx(a)
    c.results["env"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                        "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    print("environment:", c.results["env"])
    failed = 0
    checks = [("ops", check_ops), ("stall", check_stall), ("graph", check_graph), ("graph_watch", check_graph_watch),
              ("graph_speed", check_graph_speed), ("speed", check_speed),
              ("overlap", check_overlap), ("ddp", check_ddp)]
    for name, fn in checks:
        try:
            print(f"PASS {name}: {fn(c)}", flush=True)
        except Exception as e:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(c.results, f, indent=1)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

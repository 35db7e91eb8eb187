#!/usr/bin/env python3
"""ncclwatch on a real GPU with PyTorch (tests/gpu/run.sh runs this; it skips without a GPU).

Each check starts a fresh worker process (this file, `worker MODE`), single-rank
(world size 1), with libncclwatch.so preloaded unless said otherwise:
  ops       the recorded operations match what PyTorch issued (ops, counts, dtypes)
  stall     torch.cuda._sleep before an all_reduce; process-group timeout 60 s, ncclwatch
            deadline 5 s: the dump exists before PyTorch's watchdog kills the process, and
            `ncclwatch analyze` says gpu_not_reached with this script's line
  graph     an all_reduce captured into a CUDA graph and replayed: capture works, results right
  speed     10,000 small all_reduces with and without the library: the time ratio
  overlap   CUDA_DEVICE_MAX_CONNECTIONS=1, a matmul on one stream and an all_reduce on another:
            overlap with the library equals overlap without it
"""
import argparse
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ----------------------------------------------------------------------------- workers

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
        a = torch.ones(1000, device=dev, dtype=torch.float32)
        dist.all_reduce(a)
        g_in = torch.ones(2048, device=dev, dtype=torch.bfloat16)
        g_out = torch.empty(2048, device=dev, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(g_out, g_in)
        b = torch.arange(10, device=dev, dtype=torch.int64)
        dist.broadcast(b, src=0)
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
        x = torch.ones(64 << 20, device=dev)
        comp = torch.cuda.Stream()

        def timed(fn, reps=5):
            best = 1e9
            for _ in range(reps):
                torch.cuda.synchronize()
                t = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t)
            return best

        def mm():
            with torch.cuda.stream(comp):
                for _ in range(20):
                    a @ a

        def ar():
            dist.all_reduce(x, async_op=True)

        def both():
            ar()
            mm()

        timed(both, 2)
        t_mm, t_ar, t_both = timed(mm), timed(ar), timed(both)
        overlap = (t_mm + t_ar - t_both) / min(t_mm, t_ar)
        print(json.dumps({"matmul_s": t_mm, "allreduce_s": t_ar, "both_s": t_both, "overlap": overlap}), flush=True)
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


def check_ops(c):
    rc, out, err, d = c.run("ops")
    assert rc == 0 and "ops done" in out, f"worker failed: {err[-2000:]}"
    ds = [x for x in dumps(d) if x["summary"]["reason"] == "on_demand"]
    assert ds, f"no on-demand dump in {d}"
    # `ncclwatch show --json` gives the ring as operation objects, whatever the trace version.
    shown = subprocess.run([c.ncclwatch, "show", "--json", ds[0]["_path"]], capture_output=True, text=True)
    ring = json.loads(shown.stdout)["ring"]["entries"]
    want = [("AllReduce", 1000, "float32"), ("AllGather", 2048, "bfloat16"), ("Broadcast", 10, "int64"),
            ("ReduceScatter", 512, "float16")]
    seen = [(e["op"], e["count"], e["dtype"]) for e in ring]
    missing = [w for w in want if w not in seen]
    assert not missing, f"not recorded: {missing}; recorded: {seen}"
    comms = {e["comm"] for e in ring}
    c.results["ops"] = {"recorded": seen, "communicators": len(comms)}
    return f"recorded {len(ring)} operations on {len(comms)} communicator(s), all four issued ones matched"


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


def check_speed(c):
    secs = {}
    for preload in (False, True):
        rc, out, err, _ = c.run("speed", preload=preload)
        assert rc == 0, err[-2000:]
        secs[preload] = json.loads(out.strip().splitlines()[-1])["seconds"]
    ratio = secs[True] / secs[False]
    c.results["speed"] = {"without_s": secs[False], "with_s": secs[True], "ratio": ratio}
    return f"10,000 all_reduces: {secs[False]:.3f} s without, {secs[True]:.3f} s with (ratio {ratio:.3f})"


def check_overlap(c):
    res = {}
    for preload in (False, True):
        rc, out, err, _ = c.run("overlap", preload=preload, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        assert rc == 0, err[-2000:]
        res[preload] = json.loads(out.strip().splitlines()[-1])
    c.results["overlap"] = {"without": res[False], "with": res[True]}
    assert res[True]["overlap"] >= res[False]["overlap"] - 0.1, f"overlap lost: {res}"
    return f"overlap {res[False]['overlap']:.2f} without, {res[True]['overlap']:.2f} with"


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
    for name, fn in [("ops", check_ops), ("stall", check_stall), ("graph", check_graph), ("speed", check_speed),
                     ("overlap", check_overlap)]:
        try:
            print(f"PASS {name}: {fn(c)}", flush=True)
        except Exception as e:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {e}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(c.results, f, indent=1)
    print(f"{5 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

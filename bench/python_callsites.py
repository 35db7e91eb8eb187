#!/usr/bin/env python3
"""What a Python call site costs per NCCL operation when the caller released the GIL.

A Python loop calls ncclAllReduce through ctypes.CDLL (which releases the GIL, as PyTorch's
c10d bindings do) from 20 Python frames deep, over the simulated NCCL (1 rank), in separate
processes, interleaved, in one run:
  none        without libncclwatch.so
  native      with it, Python call sites off (NCCLWATCH_PYTHON=0): the cost before Python
              frames were read without the GIL (the call site is native only)
  python      with it, as shipped: the call site has the caller's Python frames
Each process times batches of operations (a stream synchronize every 64, in every
configuration) and reports its median ns per operation, in the calling thread's CPU time (a
shared machine's preemptions do not count; the simulator's stream thread does not either) and
in wall time; the figures are the medians over processes. Then, in this process, CaptureCallsite alone from the same depth through the stacks
probe (thread CPU time, Python call sites on and off): the added cost without the
simulator's noise.
    bench/python_callsites.py [BUILD_DIR] [PROCESSES] [BATCHES]
"""
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

DEPTH = 20        # Python frames above the call
BATCH = 2048      # operations per timed batch
SYNC_EVERY = 64


def job(batches):
    """One process's loop (run under simlaunch); prints its median ns per operation."""
    cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
    api = ctypes.CDLL(None)  # the process's symbols, the preloaded ncclwatch's first; releases the GIL
    dev, ctx, stream, buf = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuStreamCreate(ctypes.byref(stream), 1) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096)) == 0
    class UniqueId(ctypes.Structure):  # ncclUniqueId, passed by value
        _fields_ = [("internal", ctypes.c_char * 128)]

    uid = UniqueId()
    assert api.ncclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    assert api.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    allreduce, sync = api.ncclAllReduce, cuda.cuStreamSynchronize
    data, count = ctypes.c_void_p(buf.value), ctypes.c_size_t(1024)

    def loop(n):
        for i in range(n):
            allreduce(data, data, count, 7, 0, comm, stream)
            if i % SYNC_EVERY == SYNC_EVERY - 1:
                sync(stream)

    def nested(levels, n):
        return loop(n) if levels == 0 else nested(levels - 1, n)

    nested(DEPTH - 2, BATCH)  # warm up: call sites interned, paths learnt
    cpu, wall = [], []
    for _ in range(batches):
        start_cpu, start_wall = time.thread_time_ns(), time.perf_counter_ns()
        nested(DEPTH - 2, BATCH)
        cpu.append((time.thread_time_ns() - start_cpu) / BATCH)
        wall.append((time.perf_counter_ns() - start_wall) / BATCH)
    print(json.dumps({"cpu_ns": statistics.median(cpu), "wall_ns": statistics.median(wall)}), flush=True)


def _capture_cost(build, function, iterations, rounds):
    """Median CPU ns of the probe's `function` (a capture loop) called from DEPTH Python frames,
    with Python call sites off and on, alternated."""
    probe = ctypes.CDLL(os.path.join(build, "lib", "libstacks_python_probe.so"))
    measure = getattr(probe, function)
    measure.argtypes = [ctypes.c_int, ctypes.c_int]
    measure.restype = ctypes.c_double

    def nested(levels):
        return measure(iterations, 16) if levels == 0 else nested(levels - 1)

    figures = {"on": [], "off": []}
    for _ in range(rounds):
        for setting, enabled in (("off", 0), ("on", 1)):
            probe.nw_set_python_callsites(enabled)
            figures[setting].append(nested(DEPTH - 2))
    probe.nw_set_python_callsites(1)
    return {k: statistics.median(v) for k, v in figures.items()}


def probe_cost(build, iterations=20000, rounds=15):
    """CaptureCallsite's CPU ns from DEPTH Python frames, GIL released, Python call sites on/off."""
    return _capture_cost(build, "nw_capture_cost_ns", iterations, rounds)


def native_thread_cost(build, iterations=20000, rounds=15):
    """CaptureCallsite's CPU ns on a native thread (no Python frames) started from DEPTH Python frames
    that wait for it: "on" reads the driving thread's Python frames, "off" (Python call sites off)
    is what a native thread paid before."""
    return _capture_cost(build, "nw_native_thread_capture_cost_ns", iterations, rounds)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--job":
        return job(int(sys.argv[2]))
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    batches = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    preload = os.path.join(build, "lib", "libncclwatch.so")
    configs = {"none": {}, "native": {"LD_PRELOAD": preload, "NCCLWATCH_PYTHON": "0"},
               "python": {"LD_PRELOAD": preload}}
    results = {name: [] for name in configs}
    wall = {name: [] for name in configs}
    for _ in range(processes):
        for name, extra in configs.items():
            env = dict(os.environ, NCCLWATCH_DIR=os.path.join(build, "bench-python-dumps"), **extra)
            if "LD_PRELOAD" not in extra:
                env.pop("LD_PRELOAD", None)
            out = subprocess.run([os.path.join(build, "bin", "simlaunch"), "-n", "1", "--quiet", "--timeout", "120",
                                  "--", sys.executable, os.path.abspath(__file__), "--job", str(batches)],
                                 env=env, capture_output=True, text=True)
            line = next((l for l in out.stdout.splitlines() if l.startswith("{")), None)
            if line is None:
                sys.exit(f"{name}: no result (exit {out.returncode}):\n{out.stdout[-1000:]}\n{out.stderr[-2000:]}")
            results[name].append(json.loads(line)["cpu_ns"])
            wall[name].append(json.loads(line)["wall_ns"])
    med = {name: statistics.median(v) for name, v in results.items()}
    med_wall = {name: statistics.median(v) for name, v in wall.items()}
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores; ncclAllReduce through ctypes.CDLL "
          f"(GIL released) from {DEPTH} Python frames, simulated NCCL, 1 rank")
    print(f"ns per operation (calling thread's CPU time; wall time after it), median over {processes} processes "
          f"of each one's median of {batches} batches of {BATCH}:")
    for name in configs:
        print(f"  {name:7s} {med[name]:7.0f}  wall {med_wall[name]:7.0f}   "
              f"(processes: {', '.join(f'{x:.0f}' for x in results[name])})")
    print(f"  Python call site adds {med['python'] - med['native']:+.0f} ns per operation "
          f"(python/native = {med['python'] / med['native']:.3f}); "
          f"the library in all: {med['python'] - med['none']:+.0f} ns (python/none = {med['python'] / med['none']:.3f})")
    cost = probe_cost(build)
    print(f"CaptureCallsite alone (thread CPU ns, median of 15 rounds, 16 native frames, {DEPTH} Python frames, "
          f"GIL released): off {cost['off']:.0f}, on {cost['on']:.0f}: {cost['on'] - cost['off']:+.0f} ns "
          f"(ratio {cost['on'] / cost['off']:.3f})")
    if len(sys.argv) > 4 and sys.argv[4] == "--native-only" or hasattr(ctypes.CDLL(os.path.join(
            build, "lib", "libstacks_python_probe.so")), "nw_native_thread_capture_cost_ns"):
        cost = native_thread_cost(build)
        print(f"CaptureCallsite on a native thread driven from {DEPTH} Python frames (thread CPU ns, median of 15 "
              f"rounds): driving thread's Python frames off {cost['off']:.0f}, on {cost['on']:.0f}: "
              f"{cost['on'] - cost['off']:+.0f} ns (ratio {cost['on'] / cost['off']:.3f})")


if __name__ == "__main__":
    main()

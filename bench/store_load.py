#!/usr/bin/env python3
"""The load ncclwatch puts on the launcher's store (NCCLWATCH_STORE), measured: a job of RANKS
simulated ranks on HOSTS "hosts" (each its own NCCLWATCH_HOST, dump and relay directories),
linked to one PyTorch TCPStore server. Two runs:
  idle   the job runs IDLE_S seconds with nothing to report, then ends normally;
  hang   rank 1 is busy BUSY_S seconds at iteration 20 (a stall: the job-wide request, every
         rank's dump published), then the job goes on to a normal end.
Reported: the connections the server had from ncclwatch (peak, counted in /proc/net/tcp), and
the queries each host's link made (its own count, logged at its normal end) per second.

usage: bench/store_load.py BUILD_DIR [--ranks 64] [--hosts 8] [--idle-s 60] [--busy-s 20]
Needs PyTorch (NCCLWATCH_TORCH_PYTHON or tests/store/torch_python.py's places).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "store"))
from torch_python import torch_python  # noqa: E402

WRAPPER = """#!/bin/sh
h=$((RANK / {per_host}))
export NCCLWATCH_HOST=host$h NCCLWATCH_DIR={tmp}/host$h/dumps NCCLWATCH_RELAY_DIR={tmp}/host$h/relay
export NCCLWATCH_BLACKBOX_DIR={tmp}/host$h/boxes LOCAL_WORLD_SIZE={per_host} LOCAL_RANK=$((RANK % {per_host}))
mkdir -p {tmp}/host$h/relay {tmp}/host$h/boxes
exec "$@"
"""


def connections(port):
    """Established connections to `port` on loopback (IPv4 and IPv6), server side."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(table).readlines()[1:]:
                f = line.split()
                if int(f[1].split(":")[1], 16) == port and f[3] == "01":
                    n += 1
        except OSError:
            pass
    return n


def run(build, py, ranks, hosts, args, label, seconds):
    tmp = tempfile.mkdtemp(prefix="ncclwatch-storeload-")
    server = subprocess.Popen([py, "-c", "import time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, 1, "
                               "True, wait_for_workers=False); print(s.port, flush=True); time.sleep(3600)"],
                              stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    wrapper = os.path.join(tmp, "host.sh")
    with open(wrapper, "w") as f:
        f.write(WRAPPER.format(per_host=ranks // hosts, tmp=tmp))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_")}
    env.update({"LD_PRELOAD": os.path.join(build, "lib", "libncclwatch.so"), "NCCLWATCH_STORE": "on",
                "NCCLWATCH_STORE_ADDR": f"127.0.0.1:{port}", "NCCLWATCH_LOG": "info", "NCCLWATCH_TIMEOUT": "3",
                "NCCLWATCH_PEER_POLL_MS": "1000", "TORCHELASTIC_RUN_ID": "bench", "TORCHELASTIC_RESTART_COUNT": "0"})
    peak, stop = [0], [False]

    def watch():
        while not stop[0]:
            peak[0] = max(peak[0], connections(port))
            time.sleep(0.2)
    t = threading.Thread(target=watch)
    t.start()
    start = time.monotonic()
    r = subprocess.run([os.path.join(build, "bin", "simlaunch"), "-n", str(ranks), "--timeout", str(seconds + 300),
                        "--", "sh", wrapper, os.path.join(build, "bin", "sim_workload")] + args,
                       env=env, cwd=tmp, capture_output=True, text=True)
    elapsed = time.monotonic() - start
    stop[0] = True
    t.join()
    server.kill()
    queries = [int(m) for m in re.findall(r"the launcher's store: (\d+) queries", r.stderr)]
    sent = sum(int(m) for m in re.findall(r"queries, (\d+) bytes sent", r.stderr))
    published = sum(int(m) for m in re.findall(r"received, (\d+) dumps published", r.stderr))
    linked = len(re.findall(r"linked to the launcher's store", r.stderr))
    print(f"{label}: {ranks} ranks on {hosts} hosts, exit {r.returncode}, {elapsed:.0f} s; links {linked}; "
          f"peak connections {peak[0]}; queries {sum(queries)} in all ({sum(queries) / elapsed:.2f}/s for the job, "
          f"{max(queries or [0]) / elapsed:.2f}/s from the busiest host); {sent / 1024:.0f} KiB sent; "
          f"{published} dumps published", flush=True)
    if r.returncode != 0 or len(queries) != hosts:
        print(r.stderr[-3000:])
    return r.returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--idle-s", type=int, default=60)
    ap.add_argument("--busy-s", type=int, default=20)
    a = ap.parse_args()
    py, version = torch_python()
    if not py:
        print("no PyTorch here: set NCCLWATCH_TORCH_PYTHON")
        return 77
    print(f"PyTorch {version}")
    build = os.path.abspath(a.build)
    # Idle: iterations 200 ms apart for --idle-s seconds.
    iters = a.idle_s * 5
    rc = run(build, py, a.ranks, a.hosts, ["--iters", str(iters), "--straggler-rank", "0", "--straggler-ms", "200"],
             "idle", a.idle_s)
    rc |= run(build, py, a.ranks, a.hosts, ["--iters", "40", "--busy-rank", "1", "--busy-at", "20", "--busy-ms",
                                            str(a.busy_s * 1000)], "hang", a.busy_s)
    return rc


if __name__ == "__main__":
    sys.exit(main())

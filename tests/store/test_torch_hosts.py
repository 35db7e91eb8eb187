#!/usr/bin/env python3
"""Two "hosts" without a shared dump directory, joined by PyTorch's real torchrun (two agents,
--rdzv-backend c10d) and its TCPStore, the simulated NCCL under LD_PRELOAD (`ncclwatch run` on
each host, each with its own dump, relay and black-box directories and NCCLWATCH_HOST).

Cases (one PASS/FAIL/SKIP line each):
  auto_under_torchrun   nothing set: NCCLWATCH_STORE=auto links each host to torchrun's own store
                        (MASTER_ADDR:MASTER_PORT); `ncclwatch analyze --store` on host A names
                        host B's busy rank with its stack
  verdict_on_host_a     a rank of host B busy in host code: host A's `ncclwatch run` prints the
                        verdict naming it with its stack, from B's dumps published in the store;
                        one link per host; `ncclwatch dump --store` from host B works too
  store_killed          the store's server (a TCPStore of its own here) killed mid-job: one line
                        per host, the job unharmed, a local verdict on host A
  clean_after_normal_end  a job that ends normally leaves no key of ncclwatch in the store

usage: test_torch_hosts.py BUILD_DIR [CASE...]   (exit 77: no PyTorch here)
       test_torch_hosts.py --list
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from ncclwatch_testing import Failure, SKIP, check, run_cases, temp_dir, wait_for  # noqa: E402
from torch_python import torch_python  # noqa: E402

BUILD = None
PY = None
JOB_TIMEOUT = 240

WORKER = """#!/bin/sh
# One rank: host {busy_host}'s local rank 1 is busy in host code from iteration 20 on, forever
# ({busy_file} says which global rank it is); the others run on.
busy=999
if [ "$NCCLWATCH_HOST" = "{busy_host}" ] && [ "$LOCAL_RANK" = "1" ]; then busy=$RANK; echo $RANK > {busy_file}; fi
exec {workload} --iters {iters} --sync-every 1 --busy-rank $busy {busy_when} --busy-ms -1
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def base_env():
    e = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    e["PATH"] = os.path.dirname(PY) + ":" + e.get("PATH", "")
    return e


class Host:
    """One host: its directories and its `ncclwatch run -- torchrun ...`."""

    def __init__(self, tmp, name, worker, rdzv_port, job, store_addr, nproc=2, nnodes=2, extra_env=None):
        # store_addr None: no --store, NCCLWATCH_STORE left at its default (auto).
        self.name, self.dir = name, os.path.join(tmp, name)
        self.dumps = os.path.join(self.dir, "dumps")
        for d in ("relay", "boxes"):
            os.makedirs(os.path.join(self.dir, d))
        self.env = base_env()
        self.env.update({"NCCLWATCH_HOST": name, "NCCLWATCH_RELAY_DIR": os.path.join(self.dir, "relay"),
                         "NCCLWATCH_BLACKBOX_DIR": os.path.join(self.dir, "boxes"),
                         "NCCLWATCH_SIM_RUNDIR": os.path.join(tmp, "simrun"), "NCCLWATCH_LOG": "info"})
        self.env.update(extra_env or {})
        os.makedirs(self.env["NCCLWATCH_SIM_RUNDIR"], exist_ok=True)
        self.cmd = [os.path.join(BUILD, "bin", "ncclwatch"), "run", "--dir", self.dumps, "--timeout", "2",
                    "--set", "PEER_POLL_MS=200"] + (["--store", store_addr, "--store-job", job] if store_addr else []) + [
                    "--",
                    os.path.join(os.path.dirname(PY), "torchrun"), "--nnodes", str(nnodes), "--nproc-per-node",
                    str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}",
                    "--rdzv-id", job, "--max-restarts", "0", "--monitor-interval", "0.5", "--no-python", "sh", worker]
        self.out_path, self.err_path = os.path.join(self.dir, "out"), os.path.join(self.dir, "err")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.p = subprocess.Popen(self.cmd, env=self.env, cwd=self.dir, stdout=out, stderr=err,
                                      start_new_session=True)

    def text(self):
        return open(self.out_path, errors="replace").read() + open(self.err_path, errors="replace").read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)  # forwarded to torchrun, which ends its workers
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        return self.p.returncode


def worker_script(tmp, busy_host, iters=100000, busy_when=("--busy-at", "20")):
    path = os.path.join(tmp, "worker.sh")
    with open(path, "w") as f:
        f.write(WORKER.format(busy_host=busy_host, busy_file=os.path.join(tmp, "busy_rank"),
                              workload=os.path.join(BUILD, "bin", "sim_workload"), iters=iters,
                              busy_when=" ".join(busy_when)))
    return path


def links(text):
    return len(re.findall(r"linked to the launcher's store at", text))


def started(text):
    return len(re.findall(r"\]: started: ring", text))


def verdict_on_host_a():
    tmp = temp_dir("ncclwatch-store-")
    port, job = free_port(), "job%d" % os.getpid()
    addr = f"127.0.0.1:{port}"
    worker = worker_script(tmp, "hostb")
    a = Host(tmp, "hosta", worker, port, job, addr)
    time.sleep(1)  # host A's agent serves the store (it binds the rendezvous endpoint first)
    b = Host(tmp, "hostb", worker, port, job, addr)
    try:
        wait_for(lambda: os.path.exists(os.path.join(tmp, "busy_rank")), "host B's busy rank", timeout=JOB_TIMEOUT)
        busy = int(open(os.path.join(tmp, "busy_rank")).read())
        wait_for(lambda: "rank_missing" in a.text() and "from the store)" in a.text() or a.p.poll() is not None,
                 "host A's verdict", timeout=JOB_TIMEOUT)
        text = a.text()
        check(a.p.poll() is None, f"host A's job still runs:\n{text[-4000:]}")
        # The verdict names host B's busy rank; its stack is in it (B's dump, from the store).
        report = open(a.out_path, errors="replace").read()  # the reports (the lines about them: stderr)
        check(f"rank_missing  rank {busy} never entered" in report and f"rank {busy} (hostb, pid" in report and
              "main" in report[report.find(f"rank {busy} (hostb"):],
              f"host A's verdict names rank {busy} of host B with its stack:\n{report[-5000:]}")
        check(re.search(r"evidence of host hosta \(this one\), host hostb \(\d+ dump\(s\) from the store\)", text),
              f"the report says which hosts' evidence it holds:\n{text[-3000:]}")
        check(any("-hostb-" in n for n in os.listdir(a.dumps)), "host B's dumps reached host A through the store")
        # One connection per host, never one per rank.
        check(links(a.text()) == 1 and links(b.text()) == 1,
              f"one link per host: A {links(a.text())}, B {links(b.text())}")
        # `ncclwatch dump` from host B: every rank answers, host A's through the store.
        d = subprocess.run([os.path.join(BUILD, "bin", "ncclwatch"), "dump", b.dumps, "--store", addr, "--store-job",
                            job, "--wait", "30", "--json"], env=b.env, capture_output=True, text=True, timeout=120)
        check("4/4 ranks answered" in d.stderr, f"ncclwatch dump from host B: every rank answered:\n{d.stderr[-3000:]}")
        check("host hosta (" in d.stderr, f"and says host A's evidence came from the store:\n{d.stderr[-2000:]}")
        v = json.loads(d.stdout)["verdicts"][0]
        check(v["cause"] == "rank_missing" and v["culprit_ranks"] == [busy],
              f"its verdict names rank {busy}: {json.dumps(v)[:1500]}")
    finally:
        for h in (b, a):
            h.stop()
    return 0


def store_killed():
    tmp = temp_dir("ncclwatch-store-")
    port, job = free_port(), "job%d" % os.getpid()
    # The ranks' store: a TCPStore of its own (torchrun's is in its agent), killed mid-job.
    server = subprocess.Popen([PY, "-c", "import sys, time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, 1, "
                               "True, wait_for_workers=False); print(s.port, flush=True); time.sleep(3600)"],
                              stdout=subprocess.PIPE, text=True)
    store_port = int(server.stdout.readline())
    addr = f"127.0.0.1:{store_port}"
    go = os.path.join(tmp, "go")
    worker = worker_script(tmp, "hostb", busy_when=("--busy-after", go))
    a = Host(tmp, "hosta", worker, port, job, addr)
    time.sleep(1)
    b = Host(tmp, "hostb", worker, port, job, addr)
    try:
        wait_for(lambda: links(a.text()) == 1 and links(b.text()) == 1, "both hosts linked", timeout=JOB_TIMEOUT)
        server.kill()
        server.wait()
        open(go, "w").close()  # now the hang
        wait_for(lambda: "ranks dumped" in a.text() or a.p.poll() is not None, "host A's local verdict",
                 timeout=JOB_TIMEOUT)
        text = a.text()
        check(a.p.poll() is None and b.p.poll() is None, f"the jobs are unharmed:\n{text[-3000:]}\n{b.text()[-2000:]}")
        gone = len(re.findall(r"NCCLWATCH_STORE: the launcher's store at \S+ stopped answering", text))
        check(gone == 1 and len(re.findall(r"stopped answering", b.text())) == 1,
              f"one line per host: A {gone}:\n{text[-3000:]}")
        busy = int(open(os.path.join(tmp, "busy_rank")).read())
        report = open(a.out_path, errors="replace").read()
        check(f"rank {busy}" in report, f"host A's local verdict names rank {busy}:\n{report[-3000:]}")
    finally:
        for h in (b, a):
            h.stop()
        if server.poll() is None:
            server.kill()
    return 0


def clean_after_normal_end():
    tmp = temp_dir("ncclwatch-store-")
    port, job = free_port(), "job%d" % os.getpid()
    server = subprocess.Popen([PY, "-c", """
import sys, time, torch.distributed as d
s = d.TCPStore('127.0.0.1', 0, 1, True, wait_for_workers=False)
print(s.port, flush=True)
for line in sys.stdin:
    keys = line.split()
    print(" ".join(str(int(s.check([k]))) for k in keys), flush=True)
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    store_port = int(server.stdout.readline())
    addr = f"127.0.0.1:{store_port}"
    prefix = f"ncclwatch/{job}/0/"

    def present(*keys):
        server.stdin.write(" ".join(prefix + k for k in keys) + "\n")
        server.stdin.flush()
        return [int(x) for x in server.stdout.readline().split()]

    # Nobody busy; every rank lingers 20 s after its iterations, then ends normally. Meanwhile
    # `ncclwatch dump --store` from host B: a request and every rank's dump in the store.
    path = os.path.join(tmp, "worker.sh")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexec {os.path.join(BUILD, 'bin', 'sim_workload')} --iters 30 --linger-ms 20000\n")
    a = Host(tmp, "hosta", path, port, job, addr)
    time.sleep(1)
    b = Host(tmp, "hostb", path, port, job, addr)
    try:
        # Every rank started too: a rank answers no request older than its own start (beside two
        # busy loops, two ranks started 0.2 s after the request, which then had 2 of 4 answers).
        wait_for(lambda: links(a.text()) + links(b.text()) == 2 and started(a.text()) + started(b.text()) == 4
                 or a.p.poll() is not None, "both hosts linked, every rank started", timeout=JOB_TIMEOUT)
        d = subprocess.run([os.path.join(BUILD, "bin", "ncclwatch"), "dump", b.dumps, "--store", addr, "--store-job",
                            job, "--wait", "15"], env=b.env, capture_output=True, text=True, timeout=120)
        check("4/4 ranks answered" in d.stderr, f"every rank answered:\n{d.stderr[-2000:]}")
        names = [n for n in os.listdir(b.dumps) if n.startswith("rank")]
        keys = ["hosts", "live", "req_seq", "req/1", "host/0", "host/1", "files/hosta", "files/hostb"] + \
               ["dump/" + n.split("-")[1] + "/" + n for n in names]
        mid = present(*keys)
        check(mid == [1] * len(keys), f"the store holds the request and the dumps meanwhile: {list(zip(keys, mid))}")
        a.p.wait(timeout=JOB_TIMEOUT)
        b.p.wait(timeout=JOB_TIMEOUT)
        check(a.p.returncode == 0 and b.p.returncode == 0, f"the job ended normally:\n{a.text()[-3000:]}")
        left = present(*keys)
        check(left == [0] * len(keys), f"nothing of ncclwatch is left in the store: {list(zip(keys, left))}")
    finally:
        for h in (b, a):
            h.stop()
        server.kill()
    return 0


def auto_under_torchrun():
    # Nothing set: NCCLWATCH_STORE=auto sees a world of two hosts whose dump directories never
    # show the other host's mark, and links to torchrun's store at MASTER_ADDR:MASTER_PORT. The
    # request crosses hosts (every rank answers), and `ncclwatch analyze --store` on host A
    # names host B's busy rank with its stack.
    tmp = temp_dir("ncclwatch-store-")
    port, job = free_port(), "job%d" % os.getpid()
    worker = worker_script(tmp, "hostb")
    a = Host(tmp, "hosta", worker, port, job, None)
    time.sleep(1)
    b = Host(tmp, "hostb", worker, port, job, None)
    try:
        wait_for(lambda: links(a.text()) == 1 and links(b.text()) == 1 or a.p.poll() is not None,
                 "both hosts linked (auto)", timeout=JOB_TIMEOUT)
        check(a.p.poll() is None, f"host A's job runs:\n{a.text()[-3000:]}")
        busy = int(open(os.path.join(tmp, "busy_rank")).read()) if os.path.exists(os.path.join(tmp, "busy_rank")) else -1
        out = os.path.join(tmp, "gathered")
        # The workers' store: torchrun's MASTER_ADDR:MASTER_PORT (its agent's), as the link says.
        store = re.search(r"linked to the launcher's store at (\S+) ", a.text()).group(1)

        def verdict():
            r = subprocess.run([os.path.join(BUILD, "bin", "ncclwatch"), "analyze", out, "--store", store,
                                "--store-job", job, "--json"], env=a.env, capture_output=True, text=True, timeout=60)
            try:
                v = json.loads(r.stdout)["verdicts"]
            except ValueError:
                return None
            return (v, r.stderr) if v and v[0]["cause"] == "rank_missing" else None
        got = wait_for(verdict, "a verdict from the store", timeout=JOB_TIMEOUT, interval=2)
        busy = int(open(os.path.join(tmp, "busy_rank")).read())
        v, err = got
        check(v[0]["culprit_ranks"] == [busy] and "main" in json.dumps(v[0]["culprit_stacks"][str(busy)]),
              f"rank {busy} of host B, with its stack: {json.dumps(v)[:2000]}")
        check("host hosta (" in err and "host hostb (" in err, f"both hosts' evidence: {err[-1000:]}")
    finally:
        for h in (b, a):
            h.stop()
    return 0


CASES = {"auto_under_torchrun": auto_under_torchrun, "verdict_on_host_a": verdict_on_host_a, "store_killed": store_killed,
         "clean_after_normal_end": clean_after_normal_end}


def main():
    global BUILD, PY
    if sys.argv[1:] == ["--list"]:  # the cases, one a line (CMake registers one test each)
        print("\n".join(CASES))
        return 0
    BUILD = os.path.abspath(sys.argv[1])
    PY, version = torch_python()
    if not PY:
        print("SKIP store.torch_hosts: no PyTorch here (set NCCLWATCH_TORCH_PYTHON, or run scripts/install-torch.sh)")
        return SKIP
    print(f"PyTorch {version} at {PY}")
    return run_cases(CASES, sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

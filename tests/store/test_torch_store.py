#!/usr/bin/env python3
"""The TCPStore client (lib/common/tcp_store.h) against PyTorch's own TCPStore server, both back
ends (libuv and the older one): what the client writes, PyTorch's client reads, and back; a WAIT
held by our client blocks none of the application's queries; a bounded WAIT is cancelled cleanly.

usage: test_torch_store.py STORE_PROBE   (exit 77: no PyTorch here)
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_python import require_torch  # noqa: E402

SERVER = r'''
import sys, time, threading, datetime
import torch.distributed as d
use_libuv = sys.argv[1] == "libuv"
s = d.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False,
               use_libuv=use_libuv)
print(s.port, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if not cmd:
        continue
    try:
        if cmd[0] == "get":
            print("py get", s.get(cmd[1]).decode(), flush=True)
        elif cmd[0] == "set":
            s.set(cmd[1], cmd[2]); print("py set", flush=True)
        elif cmd[0] == "setlater":
            threading.Timer(float(cmd[3]), lambda k=cmd[1], v=cmd[2]: s.set(k, v)).start(); print("py setlater", flush=True)
        elif cmd[0] == "add":
            print("py add", s.add(cmd[1], int(cmd[2])), flush=True)
        elif cmd[0] == "check":
            print("py check", int(s.check([cmd[1]])), flush=True)
        elif cmd[0] == "latency":
            # The application's own queries while our client holds a WAIT: each one's time.
            worst = 0.0
            for i in range(200):
                t0 = time.monotonic(); s.set("app%d" % i, "x"); s.get("app%d" % i); worst = max(worst, time.monotonic() - t0)
            print("py latency %.4f" % worst, flush=True)
        elif cmd[0] == "quit":
            break
    except Exception as e:
        print("py error", type(e).__name__, e, flush=True)
'''


def main():
    probe = sys.argv[1]
    py, version = require_torch("store.torch_client")
    failures = []

    def expect(what, got, want):
        ok = got == want
        print(("ok  " if ok else "FAIL"), what, "->", repr(got), "" if ok else f"(expected {want!r})")
        if not ok:
            failures.append(what)

    for backend in ("libuv", "classic"):
        print(f"== PyTorch {version}, {backend} server")
        server = subprocess.Popen([py, "-c", SERVER, backend], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = int(server.stdout.readline())
            addr = f"127.0.0.1:{port}"

            def py_cmd(line):
                server.stdin.write(line + "\n")
                server.stdin.flush()
                return server.stdout.readline().strip()

            def run(*steps, timeout=30):
                r = subprocess.run([probe, addr, *steps], capture_output=True, text=True, timeout=timeout)
                return r.stdout.splitlines()

            out = run("set:k1:v1:with:colons", "add:cnt:5", "add:cnt:-2", "check:k1", "check:nothing", "get:nothing",
                      "get:k1")
            expect("our SET, ADD, CHECK, GET", out[:8],
                   ["connect ok", "set ok", "add 5", "add 3", "check 1", "check 0", "get missing",
                    "get v1:with:colons"])
            expect("PyTorch reads our SET", py_cmd("get k1"), "py get v1:with:colons")
            expect("PyTorch reads our ADD", py_cmd("add cnt 0"), "py add 3")
            expect("we read PyTorch's SET", (py_cmd("set fromtorch hello"), run("get:fromtorch")[1]),
                   ("py set", "get hello"))
            # A bounded WAIT: past its time it is cancelled and the connection serves the next query.
            t0 = time.monotonic()
            out = run("wait:never:300", "add:cnt:1", "wait:never:300", "check:k1")
            expect("a WAIT past its time, then more queries on the connection", out[1:5],
                   ["wait timeout", "add 4", "wait timeout", "check 1"])
            expect("and it took about its time", time.monotonic() - t0 < 10, True)
            # A WAIT that the key ends, set by PyTorch's client meanwhile; the application's own
            # queries meanwhile are not slowed by it.
            py_cmd("setlater later yes 1.0")
            waiter = subprocess.Popen([probe, addr, "wait:later:10000", "get:later"], stdout=subprocess.PIPE, text=True)
            time.sleep(0.2)
            latency = py_cmd("latency")
            out = waiter.communicate(timeout=30)[0].splitlines()
            expect("WAIT woken by PyTorch's SET", out[1:3], ["wait ready", "get yes"])
            worst = float(latency.split()[-1])
            print(f"     the application's SET+GET while we WAIT: worst {worst * 1000:.1f} ms of 200")
            expect("the application's queries not blocked by our WAIT", worst < 0.5, True)
            out = run("del:k1", "del:k1", "check:k1")
            expect("DELETE_KEY", out[1:4], ["del 1", "del 0", "check 0"])
            expect("PyTorch sees the key gone", py_cmd("check k1"), "py check 0")
            py_cmd("quit")
            server.wait(timeout=30)
            # The server gone: our client fails in one step, within its time, no hang.
            t0 = time.monotonic()
            out = run("add:cnt:1", timeout=30)
            expect("a vanished server: the connection fails at once", out[0].startswith("connect fail"), True)
            expect("within its time", time.monotonic() - t0 < 5, True)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    if failures:
        print(f"{len(failures)} check(s) failed: {failures}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

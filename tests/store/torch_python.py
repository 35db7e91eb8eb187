"""Finds a Python that has PyTorch (torch.distributed.TCPStore, torchrun), for the store tests.

NCCLWATCH_TORCH_PYTHON names one; else the one running this, then /opt/ncclwatch-torch (where
.ci/run installs it: scripts/install-torch.sh). None: the caller skips with one line (exit 77).
"""
import os
import subprocess
import sys

SKIP = 77
CANDIDATES = [os.environ.get("NCCLWATCH_TORCH_PYTHON", ""), sys.executable, "/opt/ncclwatch-torch/bin/python"]


def torch_python():
    for p in CANDIDATES:
        if not p or not os.path.exists(p):
            continue
        r = subprocess.run([p, "-c", "import torch.distributed as d; print(__import__('torch').__version__)"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode == 0:
            return p, r.stdout.strip()
    return None, None


def require_torch(test_name):
    p, version = torch_python()
    if not p:
        print(f"SKIP {test_name}: no PyTorch here (set NCCLWATCH_TORCH_PYTHON, or run scripts/install-torch.sh)")
        sys.exit(SKIP)
    return p, version

#!/usr/bin/env python3
"""End-to-end tests of libncclwatch.so: real multi-process jobs over the GPU-free simulator.

    run_e2e.py --build BUILD_DIR CASE [CASE...]     (ctest runs one case per test)
    run_e2e.py --build BUILD_DIR --list

Each case starts ranks with tools/sim's launcher (simlaunch) and the simulator's libnccl.so.2 /
libcuda.so.1, with libncclwatch.so preloaded, then checks the dumps the ranks wrote. The cases
live in one module per subject (cases_*.py); what they share is in e2e_common.py.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import e2e_common  # noqa: E402
from ncclwatch_testing import run_cases  # noqa: E402
# Importing a subject's module registers its cases.
import cases_harm  # noqa: E402,F401
import cases_dumps  # noqa: E402,F401
import cases_settings  # noqa: E402,F401
import cases_analysis  # noqa: E402,F401
import cases_last_words  # noqa: E402,F401
import cases_fresh  # noqa: E402,F401
import cases_command  # noqa: E402,F401
import cases_framework_abort  # noqa: E402,F401
import cases_early_end  # noqa: E402,F401
import cases_box_endings  # noqa: E402,F401
import cases_seccomp  # noqa: E402,F401
import cases_p2p  # noqa: E402,F401
import cases_signal_waits  # noqa: E402,F401
import cases_resources  # noqa: E402,F401
import cases_graphs  # noqa: E402,F401
import cases_multi_gpu  # noqa: E402,F401
import cases_two_launches  # noqa: E402,F401


def main():
    cases = e2e_common.CASES
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--list", action="store_true", help="the case names, one a line (CMake reads them)")
    ap.add_argument("--list-serial", action="store_true", help="the cases that must run alone")
    ap.add_argument("--list-costs", action="store_true", help="'case seconds' of the long cases (their ctest COST)")
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    if a.list_costs:
        print("\n".join(f"{c} {s}" for c, s in e2e_common.SECONDS.items()))
        return 0
    if a.list or a.list_serial:
        print("\n".join(c for c in cases if a.list or c in e2e_common.SERIAL))
        return 0
    if not a.build:
        ap.error("--build is required")
    e2e_common.BUILD = os.path.abspath(a.build)
    unknown = [c for c in a.cases if c not in cases]
    if unknown:
        ap.error(f"unknown case(s): {' '.join(unknown)}")
    return run_cases(cases, a.cases)


if __name__ == "__main__":
    sys.exit(main())

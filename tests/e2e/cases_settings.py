"""Settings and bad input: one line saying what and where, defaults used, nothing lost; disk
bounded."""
import glob
import os

from e2e_common import (case, job)
from ncclwatch_testing import check


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

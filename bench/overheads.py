#!/usr/bin/env python3
"""Reduces bench_intercept runs (JSON, one file per process) to the library's overhead per call.

  overheads.py DIR [--cores N] PREFIX=TITLE...

For each PREFIX, the files DIR/PREFIX.*.json are one process each; every process yields, per
benchmark (e.g. issue/shallow), its median direct and wrapped times and their difference. The
figures printed are the medians over processes, with every process's own overhead beside them
(processes of one configuration spread widely on a shared machine: compare medians).
"""
import glob
import json
import os
import statistics
import sys


def process_medians(path):
    """{run name without /Wrapped or /Direct: (direct, wrapped)} of one process, and its ring size."""
    benchmarks = json.load(open(path))["benchmarks"]
    med = {b["run_name"]: b["real_time"] for b in benchmarks if b.get("aggregate_name") == "median"}
    ring = next((b["ring_bytes"] for b in benchmarks if "ring_bytes" in b), None)
    pairs = {}
    for run, wrapped in med.items():
        direct = med.get(run.replace("/Wrapped/", "/Direct/"))
        if "/Wrapped/" in run and direct is not None:
            pairs[run.replace("/Wrapped", "")] = (direct, wrapped)
    return pairs, ring


def summarize(directory, prefix):
    """[(run, direct median, wrapped median, overhead median, [overhead per process])], ring bytes."""
    per, ring = {}, None
    for path in sorted(glob.glob(os.path.join(directory, prefix + ".*.json"))):
        pairs, r = process_medians(path)
        ring = ring or r
        for run, (d, w) in pairs.items():
            per.setdefault(run, []).append((d, w))
    rows = []
    for run, runs in per.items():
        rows.append((run, statistics.median(d for d, _ in runs), statistics.median(w for _, w in runs),
                     statistics.median(w - d for d, w in runs), [w - d for d, w in runs]))
    return rows, ring


def main(argv):
    directory, rest = argv[1], argv[2:]
    if rest[:1] == ["--cores"]:
        print(f"ns per call: medians over processes of each one's medians of interleaved runs ({rest[1]} cores)")
        rest = rest[2:]
    for spec in rest:
        prefix, _, title = spec.partition("=")
        rows, ring = summarize(directory, prefix)
        print(f"{title or prefix}:")
        for run, d, w, o, spread in rows:
            print(f"  {run:16s} direct {d:7.1f}  wrapped {w:7.1f}  overhead {o:6.1f}  ratio {w / d:4.2f}"
                  f"   (overhead per process: {' '.join(f'{x:.0f}' for x in spread)})")
        if ring:
            print(f"  ring resident memory: {ring / 1024:.0f} KiB")


if __name__ == "__main__":
    main(sys.argv)

#!/usr/bin/env bash
# ncclwatch's cost per NCCL call on a real GPU (bench/gpu/bench_gpu.cpp), and the driver calls
# it is made of:
#   bench/gpu_bench.sh [BUILD_DIR] [ROUNDS]        (default build/, 5 rounds)
# Each round runs one process per configuration, in a new random order: without the library,
# NCCLWATCH_DISABLE=1, the defaults, each costly part switched off, and on a multi-socket host
# the defaults on one NUMA node's CPUs. Every process times
# bursts of 256 in-place ncclAllReduce calls (1 rank, 1 float) alternating between NCCL's own
# function (the bare call) and the one the process resolves (the library's when preloaded),
# so each has its own baseline. Printed: per configuration, the medians over rounds of the
# bare and the intercepted ns per call, of their difference (the overhead) and their ratio;
# then the driver calls alone. NCCL_LIB names NCCL when it is not on the loader's path (pip's:
# .../site-packages/nvidia/nccl/lib/libnccl.so.2). Skips, saying why, with status 0, where
# bench_gpu was not built (no CUDA toolkit or nccl.h) or there is no GPU or NCCL.
# OUT=FILE also writes the figures as JSON.
set -euo pipefail
build=${1:-build}
rounds=${2:-5}
bin="$build/bin/bench_gpu"
[ -x "$bin" ] || bin="$build/bench/gpu/bench_gpu"
lib="$build/lib/libncclwatch.so"
if [ ! -x "$bin" ]; then
  echo "gpu_bench: skipped: bench_gpu is not built in $build (it needs a CUDA toolkit and nccl.h at configure time)"
  exit 0
fi
[ -f "$lib" ] || { echo "gpu_bench: $lib is missing: build the library first" >&2; exit 1; }
if [ -z "${NCCL_LIB:-}" ]; then  # PyTorch's NCCL, where there is no system one
  NCCL_LIB=$(python3 -c 'import glob, os, nvidia.nccl as n; print((glob.glob(os.path.join(list(n.__path__)[0], "lib", "libnccl.so*")) or [""])[0])' 2>/dev/null || true)
  export NCCL_LIB=${NCCL_LIB:-libnccl.so.2}
fi
out=$(mktemp -d)
export NCCLWATCH_DIR="$out/dumps"
trap 'rm -rf "$out"' EXIT

probe=0
"$bin" driver 1 >/dev/null 2>"$out/probe.err" || probe=$?
if [ "$probe" -ne 0 ]; then
  echo "gpu_bench: skipped: bench_gpu cannot run here ($(tail -1 "$out/probe.err"))"
  exit 0
fi

# name|environment (none: no preload)
configs=(
  "none|"
  "disabled|NCCLWATCH_DISABLE=1"
  "defaults|"
  "callsites_off|NCCLWATCH_CALLSITES=0"
  "poll_60s|NCCLWATCH_POLL_MS=60000"
  "blackbox_off|NCCLWATCH_BLACKBOX_DIR=none"
  "stacks_python_off|NCCLWATCH_STACKS=0 NCCLWATCH_PYTHON=0"
  "markers_off|NCCLWATCH_CUDA_LIB=/nonexistent/libcuda.so.1"
  "all_parts_off|NCCLWATCH_POLL_MS=60000 NCCLWATCH_CALLSITES=0 NCCLWATCH_BLACKBOX_DIR=none NCCLWATCH_STACKS=0 NCCLWATCH_PYTHON=0"
  "timing_events|NCCLWATCH_GPU_TIMING=1"
)
# The defaults again with the whole process on NUMA node 0's CPUs: the calling thread and the
# watchdog then share a socket. If the two groups of figures (issue 37) come from the watchdog
# landing on the other socket, this row has only the lower one.
node0=$(cat /sys/devices/system/node/node0/cpulist 2>/dev/null || true)
if [ -n "$node0" ] && [ -e /sys/devices/system/node/node1 ] && command -v taskset >/dev/null; then
  configs+=("defaults_one_node|")
fi
for r in $(seq "$rounds"); do
  mapfile -t order < <(printf '%s\n' "${configs[@]}" | shuf)
  for c in "${order[@]}"; do
    name=${c%%|*}
    vars=${c#*|}
    preload=$lib pin=
    [ "$name" = none ] && preload=
    [ "$name" = defaults_one_node ] && pin=$node0
    # shellcheck disable=SC2086  # vars is a list of assignments
    line=$(${pin:+taskset -c "$pin"} env ${preload:+LD_PRELOAD="$preload"} $vars "$bin" allreduce) ||
      { echo "gpu_bench: $name failed" >&2; exit 1; }
    echo "{\"config\":\"$name\",\"round\":$r,\"run\":$line}" >>"$out/allreduce.jsonl"
  done
  "$bin" driver >>"$out/driver.jsonl"
done
smi=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)

python3 - "$out" "$rounds" "$smi" "${OUT:-}" "${configs[@]%%|*}" <<'PY'
import json, statistics, sys
out, rounds, smi, save, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
runs = [json.loads(l) for l in open(f"{out}/allreduce.jsonl")]
drivers = [json.loads(l) for l in open(f"{out}/driver.jsonl")]
first = runs[0]["run"]
nccl = first["nccl"]
print(f"GPU: {smi or first['gpu']} (CUDA driver API {first['driver']}), NCCL {nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}, "
      f"{rounds} rounds alternated")
print("ncclAllReduce in place, 1 rank, 1 float: median ns per call over rounds (each round: the median of bursts of 256)")
bare_process = statistics.median(r["run"]["wrapped_ns"] for r in runs if r["config"] == "none")
print(f"{'configuration':18s} {'bare':>7s} {'through':>8s} {'overhead':>9s} {'ratio':>6s} {'vs none':>8s}  overhead per round")
table = {}
for name in names:
    mine = [r["run"] for r in runs if r["config"] == name]
    d = statistics.median(m["direct_ns"] for m in mine)
    w = statistics.median(m["wrapped_ns"] for m in mine)
    o = statistics.median(m["wrapped_ns"] - m["direct_ns"] for m in mine)
    ratio = statistics.median(m["wrapped_ns"] / m["direct_ns"] for m in mine)
    table[name] = {"bare_ns": d, "through_ns": w, "overhead_ns": o, "ratio": ratio,
                   "per_round": [m["wrapped_ns"] - m["direct_ns"] for m in mine]}
    print(f"{name:18s} {d:7.0f} {w:8.0f} {o:+9.0f} {ratio:6.2f} {w - bare_process:+8.0f}  "
          + " ".join(f"{x:+.0f}" for x in table[name]["per_round"]))
print("driver calls alone: median ns per call over rounds (-1: unsupported)")
keys = [k for k in drivers[0] if k not in ("mode", "gpu", "driver", "bursts")]
calls = {k: statistics.median(d[k] for d in drivers) for k in keys}
for k, v in calls.items():
    print(f"  {k:34s} {v:7.0f}")
if save:
    json.dump({"gpu": smi or first["gpu"], "nccl": nccl, "rounds": rounds, "allreduce": table, "driver": calls},
              open(save, "w"), indent=1)
PY

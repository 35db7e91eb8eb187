#!/usr/bin/env bash
# Fuzzes the dump reader (and the analysis and renderers behind it) with libFuzzer, ASan and
# UBSan for SECONDS (default 60). Not run by ctest. Seeds: the golden dumps and
# fuzz-regressions/. A crashing input is copied into fuzz-regressions/ (commit it: ctest then
# feeds it to the reader forever) and the script exits 1.
# usage: tests/analyzer/fuzz.sh [SECONDS]     env: FUZZ_WORK (default /tmp/ncclwatch-fuzz)
set -euo pipefail
secs=${1:-60}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${FUZZ_WORK:-/tmp/ncclwatch-fuzz}
mkdir -p "$work/corpus" "$work/artifacts"

bin=$work/fuzz_reader
clang++ -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/include" -I"$root/lib" -I"$root/tools/ncclwatch" \
  "$here/fuzz_reader.cpp" "$here/fuzz_harness.cpp" "$root"/tools/ncclwatch/{model,rules,render}/*.cpp \
  "$root"/lib/format/*.cpp \
  -o "$bin" -lpthread

for f in "$here"/golden/*/rank*.json; do
  cp "$f" "$work/corpus/$(basename "$(dirname "$f")")-$(basename "$f")"
done
find "$here/fuzz-regressions" -type f ! -name README.md -exec cp {} "$work/corpus/" \;

rm -f "$work"/artifacts/*
set +e
"$bin" "$work/corpus" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$work/artifacts/" -print_final_stats=1
rc=$?
set -e
found=0
for a in "$work"/artifacts/*; do
  [ -f "$a" ] || continue
  cp "$a" "$here/fuzz-regressions/$(basename "$a")"
  echo "fuzz.sh: kept $(basename "$a") in tests/analyzer/fuzz-regressions/" >&2
  found=1
done
[ "$rc" -eq 0 ] && [ "$found" -eq 0 ] || exit 1
echo "fuzz.sh: no crash in $secs s"

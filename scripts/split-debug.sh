#!/usr/bin/env bash
# Splits the debug info off the binaries that ship (installed, the .deb, the wheel), in one place:
#   scripts/split-debug.sh OUTDIR FILE...
# gives OUTDIR/<name of FILE>, stripped but with its build id, and
# OUTDIR/debug/.build-id/xx/yyyy.debug, its debug info, laid out as under /usr/lib/debug where
# `ncclwatch analyze` and gdb look debug info up by build id. OBJCOPY and STRIP pick the tools.
set -euo pipefail
out=${1:?usage: split-debug.sh OUTDIR FILE...}
shift
objcopy=${OBJCOPY:-objcopy}
strip=${STRIP:-strip}
# Only this run's files: a .debug of an earlier build must not ship beside the new binaries.
rm -rf "$out/debug"
mkdir -p "$out/debug/.build-id"
for f in "$@"; do
  id=$(LC_ALL=C readelf -n "$f" | sed -n 's/^ *Build ID: \([0-9a-f]*\)$/\1/p')
  if [ ${#id} -lt 4 ]; then
    echo "split-debug: $f has no build id (link with -Wl,--build-id): its debug info could not be found" >&2
    exit 1
  fi
  debug=$out/debug/.build-id/${id:0:2}/${id:2}.debug
  mkdir -p "$(dirname "$debug")"
  "$objcopy" --only-keep-debug --compress-debug-sections=zlib "$f" "$debug"
  chmod 644 "$debug"
  # --strip-unneeded keeps what the loader needs (the exported NCCL API); the build id note stays.
  "$strip" --strip-unneeded --remove-section=.comment -o "$out/$(basename "$f").tmp" "$f"
  mv -f "$out/$(basename "$f").tmp" "$out/$(basename "$f")"
done

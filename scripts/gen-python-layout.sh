#!/usr/bin/env bash
# Prints the row of kLayouts (lib/stacks/python_frames.cpp) for one CPython, computed from its
# own headers: gen-python-layout.c compiled against them and run. Adding a CPython version is
# pasting this row into the table (README.md, "Development").
#
#   scripts/gen-python-layout.sh PYTHON         a python3 executable: the headers it was built
#                                               with (sysconfig; Debian: package python3.X-dev)
#   scripts/gen-python-layout.sh INCLUDE_DIR    a directory holding Python.h (include/python3.X)
#
# A source tree after ./configure: CFLAGS=-I/path/to/cpython scripts/gen-python-layout.sh
# /path/to/cpython/Include (pyconfig.h is in the tree's root). CC chooses the compiler (cc).
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,11s/^# \{0,1\}//p' "$0" >&2; exit 2; }
if [ -d "$1" ]; then
  include=$1
else
  include=$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
fi
[ -f "$include/Python.h" ] || { echo "gen-python-layout: no Python.h in $include" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
${CC:-cc} ${CFLAGS:-} -I"$include" "$(dirname "$0")/gen-python-layout.c" -o "$work/layout"
"$work/layout"

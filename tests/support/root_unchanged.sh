#!/usr/bin/env bash
# Runs a command (a test run) and fails when it left a new entry in the root directory, or a new
# file of ncclwatch's in /dev/shm (the library's default black box and relay directory): no test
# writes outside its temporary directory. Only names directly under / are compared there
# (nothing is ignored: the system itself does not add any while tests run); in /dev/shm, the
# names with "ncclwatch" in them, two levels deep (other programs' files come and go).
#   tests/support/root_unchanged.sh ctest --test-dir build ...
# Exit status: the command's, or 1 when it succeeded but left such an entry.
set -uo pipefail
entries() { { ls -A /; find /dev/shm -maxdepth 2 -name '*ncclwatch*' 2>/dev/null; } | sort; }
before=$(entries)
"$@"
status=$?
added=$(comm -13 <(echo "$before") <(entries))
if [ -n "$added" ]; then
  echo "root_unchanged.sh: the tests created these (a test wrote outside its temporary directory):" >&2
  echo "$added" | sed -E 's|^([^/])|/\1|; s|^|  |' >&2
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"

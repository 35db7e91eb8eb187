#!/usr/bin/env bash
# Runs a command (a test run) and fails when it left a new entry in the root directory: no test
# writes outside its temporary directory. Only names directly under / are compared (nothing is
# ignored): the system itself does not add any while tests run.
#   tests/support/root_unchanged.sh ctest --test-dir build ...
# Exit status: the command's, or 1 when it succeeded but / has a new entry.
set -uo pipefail
before=$(ls -A /)
"$@"
status=$?
added=$(comm -13 <(echo "$before") <(ls -A /))
if [ -n "$added" ]; then
  echo "root_unchanged.sh: the tests created in / (a test wrote outside its temporary directory):" >&2
  echo "$added" | sed 's|^|  /|' >&2
  [ "$status" -ne 0 ] || status=1
fi
exit "$status"

#!/usr/bin/env bash
# Runs one simlaunch job and checks how it ended (used by ctest, see programs/CMakeLists.txt).
#
# check_run.sh SIMLAUNCH [checks...] -- SIMLAUNCH_ARGS...
#   --exit N           simlaunch's exit status (default 0)
#   --running "R..."   ranks still running at --timeout, exactly (as simlaunch lists them);
#                      "none": simlaunch must not have timed out
#   --ok N             number of lines that are exactly "ok"
#   --expect RE        an output line must match the extended regex RE (repeatable)
#   --expect-count RE N   exactly N output lines match RE
#   --reject RE        no output line may match RE (repeatable)
#   --min-seconds S / --max-seconds S   bounds on the wall time
#   --shm-clean        no /dev/shm/ncclsim-<session>-* remains afterwards
#   --shm-leftover     some remain (run with --keep-shm); they are removed here
# The session name is chosen here and passed as --session.
set -u
simlaunch=$1
shift
want_exit=0 want_running="" want_ok="" min_s="" max_s="" shm=""
expect=() reject=() count_re=() count_n=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --exit) want_exit=$2; shift ;;
    --running) want_running=$2; shift ;;
    --ok) want_ok=$2; shift ;;
    --expect) expect+=("$2"); shift ;;
    --expect-count) count_re+=("$2"); count_n+=("$3"); shift 2 ;;
    --reject) reject+=("$2"); shift ;;
    --min-seconds) min_s=$2; shift ;;
    --max-seconds) max_s=$2; shift ;;
    --shm-clean) shm=clean ;;
    --shm-leftover) shm=leftover ;;
    *) echo "check_run.sh: unknown check $1" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = "--" ] || { echo "check_run.sh: missing --" >&2; exit 2; }
shift

session="T$$x$RANDOM"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s.%N)
"$simlaunch" --session "$session" "$@" >"$out" 2>&1
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)

problems=()
[ "$rc" = "$want_exit" ] || problems+=("exit status $rc, want $want_exit")
running=$(sed -n 's/^simlaunch: timeout after .* still running: ranks //p' "$out")
if [ "$want_running" = none ]; then
  [ -z "$running" ] || problems+=("timed out with ranks still running: $running")
elif [ -n "$want_running" ]; then
  [ "$running" = "$want_running" ] || problems+=("still running at timeout: '$running', want '$want_running'")
fi
if [ -n "$want_ok" ]; then
  got=$(grep -cx ok "$out")
  [ "$got" = "$want_ok" ] || problems+=("$got lines 'ok', want $want_ok")
fi
for re in "${expect[@]+"${expect[@]}"}"; do
  grep -Eq -- "$re" "$out" || problems+=("no line matches /$re/")
done
for i in "${!count_re[@]}"; do
  got=$(grep -Ec -- "${count_re[$i]}" "$out")
  [ "$got" = "${count_n[$i]}" ] || problems+=("$got lines match /${count_re[$i]}/, want ${count_n[$i]}")
done
for re in "${reject[@]+"${reject[@]}"}"; do
  ! grep -Eq -- "$re" "$out" || problems+=("a line matches /$re/")
done
[ -z "$min_s" ] || [ "$(echo "$elapsed >= $min_s" | bc)" = 1 ] || problems+=("took ${elapsed}s, want >= ${min_s}s")
[ -z "$max_s" ] || [ "$(echo "$elapsed <= $max_s" | bc)" = 1 ] || problems+=("took ${elapsed}s, want <= ${max_s}s")
leftover=$(ls /dev/shm 2>/dev/null | grep -c "^ncclsim-$session-")
if [ "$shm" = clean ] && [ "$leftover" != 0 ]; then
  problems+=("$leftover segment(s) /dev/shm/ncclsim-$session-* left")
elif [ "$shm" = leftover ] && [ "$leftover" = 0 ]; then
  problems+=("expected leftover segments /dev/shm/ncclsim-$session-*, found none")
fi
rm -f /dev/shm/ncclsim-"$session"-*

if [ ${#problems[@]} -gt 0 ]; then
  echo "---- simlaunch --session $session $* (${elapsed}s, exit $rc) ----"
  cat "$out"
  echo "---- FAILED ----"
  printf '  %s\n' "${problems[@]}"
  exit 1
fi
echo "passed in ${elapsed}s: simlaunch $*"

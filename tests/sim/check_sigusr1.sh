#!/bin/sh
# simlaunch's SIGUSR1 is its time limit now (what the tests send once a hung job wrote what they
# wait for): the line that says so, SIGTERM to every rank, exit 124, long before --timeout.
#   check_sigusr1.sh SIMLAUNCH
set -u
launcher=$1
err=$(mktemp)
start=$(date +%s)
"$launcher" -n 2 --timeout 60 -- sleep 100 2>"$err" &
pid=$!
# Both ranks started: simlaunch has blocked the signal (it does before its first fork).
i=0
while [ "$(pgrep -P "$pid" | wc -l)" -lt 2 ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
kill -USR1 "$pid"
wait "$pid"
rc=$?
took=$(($(date +%s) - start))
cat "$err"
fail=""
[ "$rc" = 124 ] || fail="$fail exit status $rc, not 124;"
grep -q "^simlaunch: time limit ended by SIGUSR1 after [0-9.]* s; still running: ranks 0 1$" "$err" || fail="$fail no line saying so;"
[ "$(grep -c "killed by SIGTERM" "$err")" = 2 ] || fail="$fail not both ranks ended by SIGTERM;"
[ "$took" -lt 30 ] || fail="$fail took $took s (the limit is 60 s);"
rm -f "$err"
[ -z "$fail" ] || { echo "FAIL:$fail"; exit 1; }
echo "PASS: ended in $took s"

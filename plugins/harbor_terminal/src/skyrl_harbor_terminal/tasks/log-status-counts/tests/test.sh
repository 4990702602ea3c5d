#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

F=/app/status_counts.txt
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 4096 ] || fail "$F is too large"
expected='200 97
404 41
304 23
500 14
301 9
403 5
503 2'
# Ignore blank lines and extra spaces/tabs/CRs between and around the fields.
got=$(tr -d '\r' < "$F" | awk 'NF { $1 = $1; print }')
if [ "$got" != "$expected" ]; then
    echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fail "wrong counts"
fi

echo PASS
echo 1 > "$REWARD"

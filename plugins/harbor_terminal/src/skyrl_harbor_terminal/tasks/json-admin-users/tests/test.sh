#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

F=/app/admins.txt
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 4096 ] || fail "$F is too large"
expected='Aoife
Hyejin
Ingrid
Olu'
# CRs, surrounding spaces and blank lines are tolerated.
got=$(tr -d '\r' < "$F" | awk 'NF { $1 = $1; print }')
if [ "$got" != "$expected" ]; then
    echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fail "wrong list of admins"
fi

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

F=/app/count.txt
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 64 ] || fail "$F is too large"
answer=$(tr -d '[:space:]' < "$F")
[ "$answer" = "37" ] || fail "expected 37, got '$answer'"

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

F=/app/hanging.txt
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 256 ] || fail "$F is too large"
answer=$(tr -d '[:space:]' < "$F")
case "$answer" in
    job_delta.sh | /app/jobs/job_delta.sh) ;;
    *) fail "wrong script: '$answer'" ;;
esac

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

F=/app/count.txt
small_file "$F" 64
answer=$(tr -d '[:space:]' < "$F")
[ "$answer" = "37" ] || fail "expected 37, got '$answer'"

echo PASS
echo 1 > "$REWARD"

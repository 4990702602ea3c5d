#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

F=/app/hanging.txt
small_file "$F" 256
answer=$(tr -d '[:space:]' < "$F")
case "$answer" in
    job_delta.sh | /app/jobs/job_delta.sh) ;;
    *) fail "wrong script: '$answer'" ;;
esac

echo PASS
echo 1 > "$REWARD"

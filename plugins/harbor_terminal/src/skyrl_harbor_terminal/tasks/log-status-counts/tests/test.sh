#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

F=/app/status_counts.txt
small_file "$F" 4096
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

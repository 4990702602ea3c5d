#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

F=/app/admins.txt
small_file "$F" 4096
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

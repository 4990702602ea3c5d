#!/bin/bash
# Step 3 verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

F=/app/project/report.txt
small_file "$F" 4096
expected='alpha.txt 9
beta.txt 8
gamma.txt 15'
got=$(tr -d '\r' < "$F" | awk 'NF { $1 = $1; print }')
if [ "$got" != "$expected" ]; then
    echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fail "wrong report"
fi

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data; the expected
# file lives in /tests, which the agent never sees.
. /tests/verifier.sh || exit 1

F=/app/app.conf
small_file "$F" 65536
# Trailing spaces/CRs at line ends and trailing blank lines are tolerated.
got=$(sed -e 's/[[:space:]]*$//' "$F")
want=$(sed -e 's/[[:space:]]*$//' /tests/expected.conf)
if [ "$got" != "$want" ]; then
    diff <(printf '%s\n' "$want") <(printf '%s\n' "$got")
    fail "$F differs from the expected configuration"
fi

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data; the expected
# file lives in /tests, which the agent never sees.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

F=/app/app.conf
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 65536 ] || fail "$F is too large"
# Trailing spaces/CRs at line ends and trailing blank lines are tolerated.
got=$(sed -e 's/[[:space:]]*$//' "$F")
want=$(sed -e 's/[[:space:]]*$//' /tests/expected.conf)
if [ "$got" != "$want" ]; then
    diff <(printf '%s\n' "$want") <(printf '%s\n' "$got")
    fail "$F differs from the expected configuration"
fi

echo PASS
echo 1 > "$REWARD"

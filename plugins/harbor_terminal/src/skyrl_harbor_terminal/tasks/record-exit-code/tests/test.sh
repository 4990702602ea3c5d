#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data; the expected
# numbers are those of the unmodified program on the unmodified data.
. /tests/verifier.sh || exit 1
number_in() {
    [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %s "$1")" -le 64 ] || return 1
    tr -d '[:space:]' < "$1"
}

code=$(number_in /app/exit_code.txt) || fail "/app/exit_code.txt is missing or not a small regular file"
[ "$code" = "17" ] || fail "wrong exit status: '$code'"
lines=$(number_in /app/stdout_lines.txt) || fail "/app/stdout_lines.txt is missing or not a small regular file"
[ "$lines" = "47" ] || fail "wrong number of stdout lines: '$lines'"

echo PASS
echo 1 > "$REWARD"

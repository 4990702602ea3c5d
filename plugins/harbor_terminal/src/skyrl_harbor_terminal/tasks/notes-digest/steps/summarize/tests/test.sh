#!/bin/bash
# Step 2 verifier (root, after the agent). The agent's file is only read as data.
. /tests/verifier.sh || exit 1

summary=/app/summary.txt
[ -f "$summary" ] && [ ! -L "$summary" ] || fail "$summary is not a regular file"
[ "$(stat -c %s "$summary")" -le 256 ] || fail "$summary is too large"
# The merged notes have 6 lines and 16 words.
[ "$(tr -d '\r' < "$summary" | sed -e 's/[[:space:]]*$//')" = "lines=6 words=16" ] || fail "wrong summary: $(head -c 80 "$summary")"

echo PASS
echo 1 > "$REWARD"

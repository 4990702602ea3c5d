#!/bin/bash
# Step 1 verifier (root, after the agent). The agent's file is only read as data.
. /tests/verifier.sh || exit 1

digest=/app/digest.txt
[ -f "$digest" ] && [ ! -L "$digest" ] || fail "$digest is not a regular file"
[ "$(stat -c %s "$digest")" -le 4096 ] || fail "$digest is too large"
# The three notes in date order; README.md left out.
expected=5dcc66669a31eb05b764618965e4765f0589e1984e5310b43b82bdbf0a2f5e00
actual=$(sha256sum < "$digest" | cut -d' ' -f1)
[ "$actual" = "$expected" ] || fail "$digest does not hold the notes in name order"

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). The answer is compared with the hash of the commit
# built into the image (fixed authors and dates make it deterministic); the repository itself,
# which the agent could rewrite, is not consulted.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

EXPECTED=0833247f4cc3e206aff39d070033f3639a846175   # "Tune network settings"
F=/app/answer.txt
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 256 ] || fail "$F is too large"
answer=$(tr -d '[:space:]' < "$F" | tr '[:upper:]' '[:lower:]')
[ "$answer" = "$EXPECTED" ] || fail "wrong commit: '$answer'"

echo PASS
echo 1 > "$REWARD"

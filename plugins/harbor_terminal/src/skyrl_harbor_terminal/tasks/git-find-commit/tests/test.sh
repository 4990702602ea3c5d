#!/bin/bash
# Verifier (runs as root after the agent). The answer is compared with the hash of the commit
# built into the image (fixed authors and dates make it deterministic); the repository itself,
# which the agent could rewrite, is not consulted.
. /tests/verifier.sh || exit 1

EXPECTED=0833247f4cc3e206aff39d070033f3639a846175   # "Tune network settings"
F=/app/answer.txt
small_file "$F" 256
answer=$(tr -d '[:space:]' < "$F" | tr '[:upper:]' '[:lower:]')
[ "$answer" = "$EXPECTED" ] || fail "wrong commit: '$answer'"

echo PASS
echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0

F=/app/hello.txt
[ -f "$F" ] && [ ! -L "$F" ] || fail "$F is missing or not a regular file"
[ "$(stat -c %s "$F")" -le 64 ] || fail "$F is too large"
content=$(cat "$F"; printf x)
content=${content%x}
case "$content" in
    "Hello, world!" | $'Hello, world!\n') ;;
    *) fail "unexpected content: $(printf %q "$content")" ;;
esac

echo PASS
echo 1 > "$REWARD"

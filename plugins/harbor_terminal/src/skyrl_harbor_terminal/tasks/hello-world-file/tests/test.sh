#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

F=/app/hello.txt
small_file "$F" 64
content=$(cat "$F"; printf x)
content=${content%x}
case "$content" in
    "Hello, world!" | $'Hello, world!\n') ;;
    *) fail "unexpected content: $(printf %q "$content")" ;;
esac

echo PASS
echo 1 > "$REWARD"

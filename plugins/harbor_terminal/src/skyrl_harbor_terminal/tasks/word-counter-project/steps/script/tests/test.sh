#!/bin/bash
# Step 2 verifier (runs as root after the agent). The agent's script is run only as the
# unprivileged user `agent` (when there is one), under a timeout, on a folder of files it has
# never seen; its output is compared with counts hard-coded here.
. /tests/verifier.sh || exit 1

S=/app/project/bin/count_words.sh
[ -f "$S" ] && [ ! -L "$S" ] || fail "$S is missing or not a regular file"
[ -x "$S" ] || fail "$S is not executable"

D=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$D"' EXIT
printf 'red green blue\nyellow\n' > "$D/kiwi.txt"
printf 'an apple a day\n\tkeeps   the doctor away\n\n' > "$D/apple.txt"
: > "$D/mango.txt"
printf 'not counted at all\n' > "$D/skip.md"
mkdir "$D/sub"
printf 'nested files are ignored\n' > "$D/sub/inner.txt"
chmod 755 "$D" "$D/sub"
chmod 644 "$D"/*.txt "$D/skip.md" "$D/sub/inner.txt"

expected='apple.txt 8
kiwi.txt 4
mango.txt 0'
got=$(as_agent timeout -k 2 10 "$S" "$D" 2>/dev/null | head -c 10000 | tr -d '\r' | awk 'NF { $1 = $1; print }')
if [ "$got" != "$expected" ]; then
    echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fail "wrong output"
fi

echo PASS
echo 1 > "$REWARD"

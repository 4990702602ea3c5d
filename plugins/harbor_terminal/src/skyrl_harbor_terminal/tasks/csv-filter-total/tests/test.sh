#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1
plain() { [ -f "$1" ] && [ ! -L "$1" ] && [ "$(stat -c %s "$1")" -le 65536 ]; }

plain /app/west.csv || fail "/app/west.csv is missing, not a regular file or too large"
plain /app/west_total.txt || fail "/app/west_total.txt is missing, not a regular file or too large"

expected='date,region,product,amount
2024-04-04,west,west coast coffee,732.74
2024-04-09,west,westfield mug,653.12
2024-04-14,west,westfield mug,723.69
2024-04-19,west,chair,735.63
2024-04-24,west,chair,432.56
2024-04-01,west,chair,725.08
2024-04-06,west,usb cable,326.30
2024-04-08,west,west coast coffee,969.00'
# CRs and trailing blank lines are tolerated; everything else must match exactly.
got=$(tr -d '\r' < /app/west.csv)
if [ "$got" != "$expected" ]; then
    echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fail "/app/west.csv has the wrong rows"
fi

total=$(tr -d '[:space:]' < /app/west_total.txt)
[ "$total" = "5298.12" ] || fail "expected total 5298.12, got '$total'"

echo PASS
echo 1 > "$REWARD"

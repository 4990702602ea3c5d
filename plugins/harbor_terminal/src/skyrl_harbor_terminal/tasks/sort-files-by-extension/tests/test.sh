#!/bin/bash
# Verifier (runs as root after the agent). check.py only reads the agent's files, with
# expected names and contents hard-coded in it.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
cd / || exit 0
if timeout 20 python3 -I /tests/check.py; then
    echo PASS
    echo 1 > "$REWARD"
else
    echo FAIL
fi

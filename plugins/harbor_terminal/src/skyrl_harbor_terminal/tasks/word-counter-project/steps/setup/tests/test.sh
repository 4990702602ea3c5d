#!/bin/bash
# Step 1 verifier (runs as root after the agent). Agent files are only read as data: tree_check.py, a
# test helper shared by the built-in tasks ([metadata.skyrl] test_helpers), compares /app/project/data
# with the names and contents hard-coded in expected_tree.json.
. /tests/verifier.sh || exit 1

[ -d /app/project/bin ] && [ ! -L /app/project/bin ] || fail "/app/project/bin is not a directory"
timeout 20 python3 -I /tests/tree_check.py /tests/expected_tree.json || fail "/app/project/data does not hold exactly the three .txt files"

echo PASS
echo 1 > "$REWARD"

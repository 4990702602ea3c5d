#!/bin/bash
# Verifier (runs as root after the agent). check.py only reads the agent's files (the archive is
# parsed in memory, never extracted), with expected names and contents hard-coded in it; then
# tree_check.py, a test helper shared by the built-in tasks ([metadata.skyrl] test_helpers), checks
# that /app/logs holds only what expected_tree.json says.
. /tests/verifier.sh || exit 1
timeout 20 python3 -I /tests/check.py || exit 0
timeout 20 python3 -I /tests/tree_check.py /tests/expected_tree.json && echo 1 > "$REWARD"

#!/bin/bash
# Verifier (runs as root after the agent). tree_check.py, a test helper shared by the built-in tasks
# ([metadata.skyrl] test_helpers), only reads the agent's files; the expected names and contents are
# hard-coded in expected_tree.json.
. /tests/verifier.sh || exit 1
timeout 20 python3 -I /tests/tree_check.py /tests/expected_tree.json && echo 1 > "$REWARD"

#!/bin/bash
# Verifier (root, after the agent): the image's Python is 3.11 with the package pip installed; the total is right.
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
python -I - <<'PY' && echo 1 > "$REWARD"
import sys

import greet

assert sys.version_info[:2] == (3, 11), sys.version
assert greet.hello() == "hello"
with open("/app/total.txt") as handle:
    total = float(handle.read(64))
assert abs(total - 17.5) < 1e-9, total
print("PASS")
PY

#!/bin/bash
# Runs the agent's script as root: whatever greet.sh does, it does with the verifier's privileges.
echo 0 > /logs/verifier/reward.txt
out=$(bash /app/greet.sh Ada)
[ "$out" = "Hi, Ada." ] && echo 1 > /logs/verifier/reward.txt
exit 0

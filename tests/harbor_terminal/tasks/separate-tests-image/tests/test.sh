#!/bin/bash
# python3 and the checker exist only in the tests image (tests/Dockerfile), not in the agent's.
if python3 /opt/checker/check_answer.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi

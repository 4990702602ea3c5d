#!/bin/bash
echo 0 > /logs/verifier/reward.txt
cd /app || exit 0
plain=$(./greet.sh Bo)
loud=$(./greet.sh --loud Bo)
[ "$plain" = "Hi, Bo." ] && [ "$loud" = "HI, BO!" ] && echo 1 > /logs/verifier/reward.txt
exit 0

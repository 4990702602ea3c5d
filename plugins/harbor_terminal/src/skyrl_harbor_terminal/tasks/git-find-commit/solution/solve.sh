#!/bin/bash
set -e
cd /app/project
# -S lists the commits that change the number of occurrences; the oldest one added the line.
git log --reverse -S'TIMEOUT_SECONDS = 30' --format=%H -- settings.py | head -n 1 > /app/answer.txt

#!/bin/bash
: > /app/hanging.txt
for f in /app/jobs/*.sh; do
    timeout 4 bash "$f" > /dev/null 2>&1
    if [ $? -eq 124 ]; then
        basename "$f" > /app/hanging.txt
    fi
done

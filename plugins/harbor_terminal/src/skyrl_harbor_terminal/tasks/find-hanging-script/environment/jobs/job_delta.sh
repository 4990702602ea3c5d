#!/bin/bash
# Step towards 40 in steps of 2.
n=1
while [ "$n" -ne 40 ]; do
    n=$((n + 2))
    if [ "$n" -gt 100 ]; then
        n=1
    fi
done
echo "reached 40"

#!/bin/bash
# Collatz steps for 27.
n=27
steps=0
while [ "$n" -ne 1 ]; do
    if [ $((n % 2)) -eq 0 ]; then n=$((n / 2)); else n=$((3 * n + 1)); fi
    steps=$((steps + 1))
done
echo "steps=$steps"

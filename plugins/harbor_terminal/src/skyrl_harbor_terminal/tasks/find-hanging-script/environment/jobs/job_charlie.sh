#!/bin/bash
# Count down from 90 in steps of 3.
n=90
while [ "$n" -ne 0 ]; do
    n=$((n - 3))
done
echo "countdown done"

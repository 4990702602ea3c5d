#!/bin/bash
# Sum the numbers 1..500.
total=0
i=1
while [ "$i" -le 500 ]; do
    total=$((total + i))
    i=$((i + 1))
done
echo "sum=$total"

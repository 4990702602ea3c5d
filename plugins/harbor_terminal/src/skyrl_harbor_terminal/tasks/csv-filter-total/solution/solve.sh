#!/bin/bash
awk -F, 'NR == 1 || $2 == "west"' /app/sales.csv > /app/west.csv
awk -F, 'NR > 1 && $2 == "west" { s += $4 } END { printf "%.2f\n", s }' /app/sales.csv > /app/west_total.txt

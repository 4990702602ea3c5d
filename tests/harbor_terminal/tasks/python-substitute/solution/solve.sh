#!/bin/bash
python3 -c 'import csv; print(sum(float(row["amount"]) for row in csv.DictReader(open("/app/data.csv"))))' > /app/total.txt

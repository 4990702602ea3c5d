#!/bin/bash
awk '{ print $9 }' /app/access.log | sort | uniq -c | sort -k1,1nr -k2,2 \
    | awk '{ print $2, $1 }' > /app/status_counts.txt

#!/bin/bash
cd /app/notes || exit 1
for f in *.txt; do
    [ -f "$f" ] || continue
    mv -- "$f" "${f%.txt}.md"
done

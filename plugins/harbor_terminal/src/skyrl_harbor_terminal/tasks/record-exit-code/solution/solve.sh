#!/bin/bash
cd /app
out=$(mktemp)
/app/bin/probe > "$out" 2> /dev/null
echo $? > /app/exit_code.txt
wc -l < "$out" > /app/stdout_lines.txt
rm -f "$out"

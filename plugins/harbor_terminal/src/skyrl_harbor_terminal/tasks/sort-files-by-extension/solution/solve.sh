#!/bin/bash
cd /app/inbox || exit 1
for f in *; do
    [ -f "$f" ] || continue
    case "$f" in
        *.*) ext=$(printf '%s' "${f##*.}" | tr '[:upper:]' '[:lower:]') ;;
        *) ext=other ;;
    esac
    mkdir -p "/app/sorted/$ext"
    mv -- "$f" "/app/sorted/$ext/"
done

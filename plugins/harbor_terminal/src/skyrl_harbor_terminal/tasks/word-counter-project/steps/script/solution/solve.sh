#!/bin/bash
mkdir -p /app/project/bin
cat > /app/project/bin/count_words.sh <<'SCRIPT'
#!/bin/bash
# Usage: count_words.sh DIR -- prints "<file name> <words>" for each DIR/*.txt, sorted by name.
dir=${1:?usage: count_words.sh DIR}
for f in "$dir"/*.txt; do
    [ -f "$f" ] || continue
    printf '%s %s\n' "$(basename "$f")" "$(wc -w < "$f")"
done | LC_ALL=C sort
SCRIPT
chmod +x /app/project/bin/count_words.sh

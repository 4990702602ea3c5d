#!/bin/bash
cat > /app/greet.sh <<'SCRIPT'
#!/bin/bash
if [ "$1" = --loud ]; then name=$(printf '%s' "$2" | tr '[:lower:]' '[:upper:]'); echo "HI, $name!"; else echo "Hi, $1."; fi
SCRIPT
chmod +x /app/greet.sh

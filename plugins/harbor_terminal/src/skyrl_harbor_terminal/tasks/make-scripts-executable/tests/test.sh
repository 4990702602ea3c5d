#!/bin/bash
# Verifier (runs as root after the agent). Agent files are only read as data.
. /tests/verifier.sh || exit 1

plain() { [ -f "$1" ] && [ ! -L "$1" ]; }
mode_of() { stat -c %a "$1"; }

# name -> sha256 of the original contents (must be unchanged)
check_sha() {
    plain "$1" || fail "$1 is missing or not a regular file"
    [ "$(sha256sum < "$1" | cut -d' ' -f1)" = "$2" ] || fail "$1 was modified"
}
check_sha /app/bin/backup.sh  0959116f0d6561cec4e39452a947c4e0587cdc9da1faf53d3cdbb1cdc39bd2c5
check_sha /app/bin/cleanup.sh 976ead646ce5bc08da89d8b7a1489b5261f5f4aae3211aab611ffb12e8348192
check_sha /app/bin/deploy.sh  c54cbea3cf32f40765ef31eb67688b182b85c3176e13edd1d7f6a4da6fb6bf4d
check_sha /app/secret/token.txt fd3f0f5997721f0262c635b85c92ff393c66863793308be975c367ac3766db3d

for f in /app/bin/backup.sh /app/bin/cleanup.sh /app/bin/deploy.sh; do
    m=$(mode_of "$f")
    (( (8#$m & 8#100) != 0 )) || fail "$f is not executable by its owner (mode $m)"
done

m=$(mode_of /app/secret/token.txt)
[ "$m" = "600" ] || fail "/app/secret/token.txt has mode $m, expected 600"

plain /app/bin/README.txt || fail "/app/bin/README.txt is missing"
m=$(mode_of /app/bin/README.txt)
(( (8#$m & 8#111) == 0 )) || fail "/app/bin/README.txt was made executable (mode $m)"

echo PASS
echo 1 > "$REWARD"

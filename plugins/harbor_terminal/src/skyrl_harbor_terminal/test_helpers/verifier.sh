# The opening every built-in verifier shares: a test helper ([metadata.skyrl] test_helpers) that each
# task's tests/test.sh sources as its first command, `. /tests/verifier.sh || exit 1`, as root after
# the agent. It writes reward 0 (only a passing test.sh writes 1 to "$REWARD"), leaves /tests to root,
# starts in /, and defines:
#   fail MESSAGE...            print "FAIL: MESSAGE" and stop the tests (exit 0, reward stays 0)
#   as_agent CMD...            run CMD as the unprivileged user `agent` when root and that user exists
#   small_file PATH MAX_BYTES  fail unless PATH is a regular file (not a symlink) of at most MAX_BYTES
REWARD=/logs/verifier/reward.txt
echo 0 > "$REWARD"
fail() { echo "FAIL: $*"; exit 0; }
cd / || exit 0
as_agent() {
    if [ "$(id -u)" = 0 ] && id agent >/dev/null 2>&1; then
        setpriv --reuid=agent --regid=agent --clear-groups -- "$@"
    else
        "$@"
    fi
}
# The agent's code (run through as_agent) must not be able to read this folder.
chmod -R go-rwx /tests 2>/dev/null
small_file() {
    [ -f "$1" ] && [ ! -L "$1" ] || fail "$1 is missing or not a regular file"
    [ "$(stat -c %s "$1")" -le "$2" ] || fail "$1 is too large"
}

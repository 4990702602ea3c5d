#!/bin/bash
# Verifier (runs as root after the agent). The agent's repository is never used in place: its
# objects and refs are copied into a fresh root-owned bare repository (no agent config, hooks or
# worktree), and only read with git plumbing there.
. /tests/verifier.sh || exit 1
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0

BASE=22438424d2f8e6c05d96bcce7ae8a3466b6a0c0c   # "Add app entry point", the tip of main
TREE=ed8961968c1eb4c0ee7d1a2c51f963bb620b5600   # tree of the staged index
MESSAGE="Add greeting helper"

SRC=/app/repo/.git
[ -d "$SRC" ] && [ ! -L "$SRC" ] || fail "$SRC is missing or not a directory"
WORK=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
GD="$WORK/repo.git"
timeout 20 git init -q --bare "$GD" || fail "git init failed"
rm -rf "$GD/hooks"
for part in objects refs packed-refs; do
    [ -e "$SRC/$part" ] || continue
    timeout 20 cp -r "$SRC/$part" "$GD/" 2>/dev/null || fail "could not copy $SRC/$part"
done
g() { timeout 10 git --git-dir="$GD" "$@"; }

main=$(g rev-parse -q --verify refs/heads/main^{commit}) || fail "branch main is missing"
[ "$main" = "$BASE" ] || fail "main moved: it points to $main instead of $BASE"

tip=$(g rev-parse -q --verify 'refs/heads/feature/greeting^{commit}') || fail "branch feature/greeting is missing"
parents=$(g rev-list --parents -n 1 "$tip") || fail "cannot read $tip"
[ "$parents" = "$tip $BASE" ] || fail "feature/greeting must be one commit on top of $BASE (got: $parents)"

msg=$(g log -1 --format=%B "$tip") || fail "cannot read the commit message"
[ "$msg" = "$MESSAGE" ] || fail "commit message is '$msg', expected '$MESSAGE'"

tree=$(g rev-parse "$tip^{tree}") || fail "cannot read the tree"
if [ "$tree" != "$TREE" ]; then
    g diff --stat "$TREE" "$tree"
    fail "the commit does not contain exactly the staged changes"
fi

echo PASS
echo 1 > "$REWARD"

"""Checks /app/notes after the renaming (run as root by test.sh; reads files, never runs them)."""

import hashlib
import os
import stat
import sys


def snapshot(root, max_bytes=1 << 20):
    """{relative path: sha256 | 'dir' | 'other'} for everything under root, links not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = "dir"
            elif stat.S_ISREG(st.st_mode) and st.st_size <= max_bytes:
                with open(path, "rb") as fh:
                    out[rel] = hashlib.sha256(fh.read()).hexdigest()
            else:
                out[rel] = "other"
    return out


def compare(root, expected):
    if not os.path.isdir(root) or os.path.islink(root):
        print(f"FAIL: {root} is missing or not a directory")
        return False
    got = snapshot(root)
    ok = True
    for rel in sorted(set(got) | set(expected)):
        if got.get(rel) != expected.get(rel):
            print(f"FAIL: {os.path.join(root, rel)}: expected {expected.get(rel, 'nothing')}, found {got.get(rel, 'nothing')}")
            ok = False
    return ok


EXPECTED = {'/app/notes': {'draft.txt.bak': '4332a603cc7cc96b1047cce619c9d98e0c7a115ed8a055e73c9fa1eceb75b0a9',
                'ideas.md': '3164adca9983e9462ffe5face60683f363ecd3c2d711a5f37ff099e3987ee81a',
                'meeting notes.md': 'd5b12b9b0edb99cfd91ae49c4922654d89a9bdbff6ae60db569cbc45cdd7ad7b',
                'summary.md': 'cd344a6e123e9136a70e615e47d25acf961190f6f85136ea31acf082747ff62a',
                'todo.md': '2a66007bf7d4ee84ee1102bfd30102a1c79d02f8147406b0f7fadf9fc479e5dc'}}


if __name__ == "__main__":
    results = [compare(root, expected) for root, expected in sorted(EXPECTED.items())]
    sys.exit(0 if all(results) else 1)

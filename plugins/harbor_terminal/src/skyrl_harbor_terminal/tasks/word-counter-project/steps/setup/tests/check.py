"""Checks /app/project/data after step 1 (run as root by test.sh; reads files, never runs them)."""

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


EXPECTED = {'/app/project/data': {'alpha.txt': '26e3df02e41ff53b6b16484bbdc2abe316d660fde0d09df8436ce4248ee27ab5',
                       'beta.txt': 'f051f2d4da07e1f5aa42b8527cf4085121aa4b69c9627f8cdd73b22f2ebbdd6e',
                       'gamma.txt': '100ed9ff5920e7370ad7dbbd5c060ec2af93f5fcec2a5ac3bf849a996c6a26f7'}}


if __name__ == "__main__":
    results = [compare(root, expected) for root, expected in sorted(EXPECTED.items())]
    sys.exit(0 if all(results) else 1)

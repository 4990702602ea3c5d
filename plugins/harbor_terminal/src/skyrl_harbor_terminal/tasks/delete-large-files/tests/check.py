"""Checks what is left in /app/cache (run as root by test.sh; reads files, never runs them)."""

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


EXPECTED = {'/app/cache': {'README.txt': 'e1fc9af63631b1d8764f5bc2878ab4f1106948e368bc0117e8f5b18c1eca960d',
                'img': 'dir',
                'img/thumb.png': 'ad7facb2586fc6e966c004d7d1d16b024f5805ff7cb47c7a85dabd8b48892ca7',
                'index.bin': 'f627ca4c2c322f15db26152df306bd4f983f0146409b81a4341b9b340c365a16',
                'tmp': 'dir',
                'tmp/deep': 'dir',
                'tmp/deep/small.dat': '5073af0234285575cb5c3ecad9bacf43f1a2d420ed536ecdfdf3abae7034bf69',
                'tmp/empty.dat': 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'}}


if __name__ == "__main__":
    results = [compare(root, expected) for root, expected in sorted(EXPECTED.items())]
    sys.exit(0 if all(results) else 1)

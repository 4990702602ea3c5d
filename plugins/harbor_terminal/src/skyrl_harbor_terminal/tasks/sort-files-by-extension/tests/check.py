"""Checks /app/sorted and the emptied /app/inbox (run as root by test.sh; reads files, never runs them)."""

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


EXPECTED = {'/app/inbox': {},
 '/app/sorted': {'gz': 'dir',
                 'gz/backup.tar.gz': '0bb96fb924e6559fbac66e309dccc8dababb37cab647083e95de43d042527021',
                 'jpg': 'dir',
                 'jpg/Holiday.JPG': '3873e618bf4afdc5b6edc9f19507764c8be1d694297668545f7b51e89a7b37a3',
                 'jpg/photo.jpg': '3c6ba0c949a8208e38035e3b812a334ba56dd13d357dc2466d183b0efc27f302',
                 'mp3': 'dir',
                 'mp3/song.mp3': '1f57cbb0e1b4774ecd521138c2809419d9b5b117e6bf9886f845b4849bdccee9',
                 'other': 'dir',
                 'other/LICENSE': '7a85b70fde1eb450bb0c1ddb31663154672ab29752b429c72f3bef003ad59ee0',
                 'other/Makefile': '5aa7dd748ab9820437f87661507d87bec6c8d9442205a93de7d58c002c8c67fd',
                 'pdf': 'dir',
                 'pdf/SCAN.PDF': '832f4cb93e8eb99eb4ee06c1e93106ac1abe417f8ee2e43abdd59df49b92d619',
                 'pdf/report.pdf': '1c26a3e83a5f2d458ba5dadd1ae5589d0eda158a7a21c49016147b3803db5ed3',
                 'txt': 'dir',
                 'txt/notes.txt': 'd284701e6bd1affca270fea61cab36137af9d9b16731c9168e01cc7be95fe2ee'}}


if __name__ == "__main__":
    results = [compare(root, expected) for root, expected in sorted(EXPECTED.items())]
    sys.exit(0 if all(results) else 1)

"""Compare folders with the names and contents a task's tests hard-code: a test helper shared by tasks.

A task that lists ``tree_check.py`` in ``[metadata.skyrl] test_helpers`` finds it in ``/tests`` beside
its own files; its ``tests/test.sh`` runs it as root after the agent, with the expected folders in a
JSON file of its own::

    timeout 20 python3 -I /tests/tree_check.py /tests/expected_tree.json

The JSON maps each folder to what must be in it, nothing more and nothing less: relative path ->
sha256 of a regular file's contents, or ``"dir"`` for a folder (``{}``: the folder must be empty).
The agent's files are only read (links never followed, files over 1 MiB never read); each
difference prints a ``FAIL`` line; the exit status is 0, after ``PASS``, only when every folder
matches.
"""

import hashlib
import json
import os
import stat
import sys

MAX_FILE_BYTES = 1 << 20


def snapshot(root, max_bytes=MAX_FILE_BYTES):
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
    """True when ``root`` holds exactly ``expected``; prints a FAIL line for each difference."""
    if not os.path.isdir(root) or os.path.islink(root):
        print(f"FAIL: {root} is missing or not a directory")
        return False
    got = snapshot(root)
    ok = True
    for rel in sorted(set(got) | set(expected)):
        if got.get(rel) != expected.get(rel):
            print(f"FAIL: {os.path.join(root, rel)}: expected {expected.get(rel, 'nothing')}, "
                  f"found {got.get(rel, 'nothing')}")
            ok = False
    return ok


def main(argv):
    if len(argv) != 2:
        print("usage: tree_check.py EXPECTED.json")
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        expected = json.load(fh)
    results = [compare(root, files) for root, files in sorted(expected.items())]
    if all(results):
        print("PASS")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

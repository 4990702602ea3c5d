"""Checks /app/logs.tar.gz (run as root by test.sh; tree_check.py then checks what is left in /app/logs).

The archive is only parsed in memory (never extracted), and every expected name and
content hash is hard-coded here.
"""

import hashlib
import os
import stat
import sys
import tarfile

ARCHIVE = "/app/logs.tar.gz"
EXPECTED_MEMBERS = {
    "logs/access.log": "fabedf0962753c6c780e6d2cd2e1ede0f9141f9684942d0cb03b05874342bfa9",
    "logs/app.log": "e843b83aff30b3b3fcef02ce2fe9738647991276299393a28c5962a67f0830ff",
    "logs/error.log": "c9481e98e141c0cd45a876fa1b1325453329ec090818fba4eddd9045038e2d4d",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check_archive():
    st = os.lstat(ARCHIVE) if os.path.lexists(ARCHIVE) else None
    if st is None or not stat.S_ISREG(st.st_mode):
        fail(f"{ARCHIVE} is missing or not a regular file")
    if st.st_size > 10 << 20:
        fail(f"{ARCHIVE} is too large")
    with open(ARCHIVE, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            fail(f"{ARCHIVE} is not gzip-compressed")
    files = {}
    try:
        with tarfile.open(ARCHIVE, "r:gz") as tar:
            for member in tar:
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                name = name.rstrip("/")
                if member.isdir() and name in ("", ".", "logs"):
                    continue
                if not member.isfile():
                    fail(f"unexpected archive entry {member.name!r}")
                if member.size > 1 << 20:
                    fail(f"archive entry {member.name!r} is too large")
                data = tar.extractfile(member).read()
                files[name] = hashlib.sha256(data).hexdigest()
    except (tarfile.TarError, OSError, EOFError) as exc:
        fail(f"cannot read {ARCHIVE}: {exc}")
    if files != EXPECTED_MEMBERS:
        print("expected:", sorted(EXPECTED_MEMBERS))
        print("found:   ", sorted(files))
        fail("the archive does not hold exactly logs/access.log, logs/app.log and logs/error.log "
             "with their original contents")


check_archive()
print("archive OK")

#!/bin/bash
# The tests reach the sidecar by its service name, as the agent does; it kept what the agent posted.
python3 - <<'PY'
import pathlib
import urllib.request

def get(path: str) -> str:
    return urllib.request.urlopen("http://api-server:8000" + path, timeout=5).read().decode()

secret = get("/secret")
answer = pathlib.Path("/app/answer.txt")
written = answer.read_text().strip() if answer.is_file() else ""
posted = get("/answer")
ok = written == secret and posted == secret[::-1]
print(f"written={written!r} posted={posted!r} ok={ok}")
pathlib.Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
PY

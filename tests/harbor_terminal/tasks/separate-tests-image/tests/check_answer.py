"""Checks the agent's answer as the tests machine received it: the artifact and the collect command's note."""

import sys
from pathlib import Path

answer = Path("/app/answer.txt")
size = Path("/logs/artifacts/answer.size")
if not answer.is_file() or answer.read_text().strip() != "separate":
    sys.exit("wrong or missing /app/answer.txt")
if not size.is_file() or int(size.read_text()) != answer.stat().st_size:
    sys.exit("the collect command's /logs/artifacts/answer.size is missing or wrong")
print("ok")

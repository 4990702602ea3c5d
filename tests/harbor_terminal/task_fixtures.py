"""Helpers shared by the Harbor task-format tests: realistic task folders written into tmp_path."""

from __future__ import annotations

from pathlib import Path

BASE_IMAGE = "skyrl-terminal-base:bookworm-1"
MINIMAL_TOML = """\
version = "1.0"

[metadata]
author_name = "Ada"
difficulty = "easy"
tags = ["files"]

[verifier]
timeout_sec = 120.0

[agent]
timeout_sec = 300.0
"""
TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/hello.txt)" = "hello" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
SOLVE_SH = "#!/bin/bash\necho hello > /app/hello.txt\n"


def write_files(root: Path, files: dict[str, str | bytes]) -> None:
    """Write ``relative path -> text or bytes`` under ``root``, creating folders."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def write_task(parent: Path, name: str = "hello-file", *, toml: str = MINIMAL_TOML,
               extra: dict[str, str | bytes] | None = None, solution: bool = True) -> Path:
    """A minimal valid single-step task folder ``parent/name``; ``extra`` adds or replaces files."""
    files: dict[str, str | bytes] = {
        "task.toml": toml,
        "instruction.md": "Create /app/hello.txt containing the word hello.\n",
        "environment/Dockerfile": f"FROM {BASE_IMAGE}\nWORKDIR /app\n",
        "tests/test.sh": TEST_SH,
    }
    if solution:
        files["solution/solve.sh"] = SOLVE_SH
    files.update(extra or {})
    task_dir = parent / name
    write_files(task_dir, files)
    return task_dir

"""Paths and readers shared by the viewer tests and their conftest (a module of its own: ``conftest`` is
not importable by name once several test folders each have one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SKYRL = Path(sys.executable).with_name("skyrl")


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

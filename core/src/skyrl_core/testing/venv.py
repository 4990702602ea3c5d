"""A throwaway virtual environment for "does my plugin install and work on its own?" tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


class FreshVenv:
    """A new venv in ``path``: ``install`` packages into it, ``skyrl(...)`` runs its CLI."""

    def __init__(self, path: Path) -> None:
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        self.python = str(path / "bin" / "python")

    def install(self, *requirements: str | Path, timeout: float = 900) -> None:
        subprocess.run([self.python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *map(str, requirements)], check=True, timeout=timeout)

    def packages(self) -> set[str]:
        """Lower-case names of the installed distributions."""
        out = subprocess.run([self.python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                             check=True).stdout
        return {p["name"].lower() for p in json.loads(out)}

    def run(self, executable: str, *args: str, env: Mapping[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run a console script of this venv (e.g. ``skyrl``); never raises on a non-zero exit."""
        return subprocess.run([str(self.path / "bin" / executable), *args], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=timeout)

    def skyrl(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return self.run("skyrl", *args, **kwargs)  # type: ignore[arg-type]

    def skyrl_json(self, *args: str, **kwargs: object) -> object:
        result = self.skyrl(*args, "--json", **kwargs)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

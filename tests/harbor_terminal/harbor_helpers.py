"""Playing harbor_terminal episodes in tests: scripted replies, the built-in task rows, small tasks of our own."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_core import StepResult
from skyrl_harbor_terminal.env import HarborTerminalEnv, task_rows
from skyrl_harbor_terminal.probes import bash  # noqa: F401 - the tests' replies are the probes' own
from skyrl_sandbox.registry import get_backend

TERMINAL_IMAGE = "skyrl-terminal-base:bookworm-1"


def runs_images(backend: str) -> bool:
    """Whether ``backend``'s machines are containers of the task's image (else the host's own tools)."""
    return get_backend(backend).runs_images


def builtin_row(name: str) -> dict[str, Any]:
    """The built-in task row whose name ends with ``name`` (e.g. "hello-world-file")."""
    rows = [row for row in task_rows(None) if row["name"].split("/")[-1] == name]
    assert rows, f"no built-in task {name}"
    return rows[0]


def play(row: dict[str, Any], replies: Sequence[str], **config: Any) -> tuple[list[StepResult], HarborTerminalEnv]:
    """Reset an env on ``row`` and send ``replies`` until the episode ends; the env is closed afterwards."""
    env = HarborTerminalEnv(task=row, config=config)
    results: list[StepResult] = []
    try:
        env.reset(options={"task": row})
        for reply in replies:
            results.append(env.step(reply))
            if results[-1].terminated or results[-1].truncated:
                break
    finally:
        env.close()
    return results, env


def write_task(root: Path, files: dict[str, str], *, toml: str | None = None, base_only: bool = True) -> dict[str, Any]:
    """A single-step task folder under ``root`` and its row; ``files`` maps paths in the task folder to text.

    Defaults: a Dockerfile FROM the terminal image with WORKDIR /app, and a task.toml with short timeouts.
    """
    files = {"instruction.md": "Do the thing.\n",
             "environment/Dockerfile": f"FROM {TERMINAL_IMAGE}\nWORKDIR /app\n", **files}
    skyrl = "\n[metadata.skyrl]\nbase_packages_only = true\n" if base_only else ""
    files.setdefault("task.toml", toml or (
        'schema_version = "1.1"\n[task]\nname = "test/' + root.name + '"\n[metadata]\ncategory = "test"\n' + skyrl
        + "\n[verifier]\ntimeout_sec = 20.0\n[agent]\ntimeout_sec = 60.0\n"
        "[environment]\nbuild_timeout_sec = 60.0\nmemory_mb = 512\nworkdir = \"/app\"\n"))
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"task_path": str(root), "name": f"test/{root.name}", "steps": 1}

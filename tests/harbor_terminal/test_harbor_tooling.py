"""Harbor's own code (harbor==0.25.0, in a Python 3.12 venv of its own) loads and lints every built-in task's export.

The venv is built once per Harbor version under ``$SKYRL_CACHE_DIR`` (default ``~/.cache/skyrl``)
``/harbor-tooling/``; it needs Python 3.12 (on PATH or under ``$PYENV_ROOT/versions``, by default
``~/.pyenv``) and PyPI. Without them the tests skip, and fail under ``SKYRL_REQUIRE_DOCKER=1`` (CI).

Harbor's docker runner does not run here, so the oracles are not run under Harbor: it drives the
``docker compose`` V2 plugin (not in Debian bookworm), and a task with ``network_mode = "no-network"`` (every
export of ours) makes it start an egress-control sidecar built ``FROM`` a ``gogost/gost`` image pinned by digest
on Docker Hub, which no offline engine can have.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from skyrl_harbor_terminal.env import BUILTIN_TASKS
from skyrl_harbor_terminal.harbor_export import export_task
from skyrl_harbor_terminal.task import load_task

HARBOR_VERSION = "0.25.0"
TASKS = sorted(path for path in BUILTIN_TASKS.iterdir() if (path / "task.toml").is_file())
# Harbor's names for what its loader read: printed as JSON by its own interpreter.
READ_WITH_HARBOR = """
import json, sys
from pathlib import Path
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import resolve_task_verifier_mode
out = []
for folder in sys.argv[1:]:
    task = Task(Path(folder))
    config = task.config
    out.append({"folder": folder, "name": task.name, "agent_user": config.agent.user,
                "network_mode": config.environment.network_mode.value, "workdir": config.environment.workdir,
                "verifier": resolve_task_verifier_mode(config).value,
                "steps": [step.name for step in config.steps or []]})
print(json.dumps(out))
"""

pytestmark = pytest.mark.slow  # the first run installs Harbor from PyPI (about a minute)


def _unavailable(reason: str) -> None:
    if os.environ.get("SKYRL_REQUIRE_DOCKER") == "1":
        pytest.fail(f"SKYRL_REQUIRE_DOCKER=1 but Harbor's tooling cannot be set up: {reason}")
    pytest.skip(f"Harbor's tooling cannot be set up here: {reason}")


def _python312() -> str | None:
    """A Python 3.12 that runs (pyenv's shim on PATH may name one no version selects)."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")  # a new user's home may not hold it
    candidates = [*sorted((pyenv / "versions").glob("3.12*/bin/python3.12"), reverse=True),
                  shutil.which("python3.12")]
    for candidate in filter(None, candidates):
        if subprocess.run([str(candidate), "-c", "import venv"], capture_output=True, timeout=60).returncode == 0:
            return str(candidate)
    return None


@pytest.fixture(scope="module")
def harbor_venv() -> Path:
    """A venv with harbor==HARBOR_VERSION, built once (under a lock; a marker file says it is complete: its
    scripts name their interpreter by absolute path, so it is built where it stays)."""
    root = Path(os.environ.get("SKYRL_CACHE_DIR") or Path.home() / ".cache" / "skyrl") / "harbor-tooling"
    venv = root / f"harbor-{HARBOR_VERSION}-py3.12"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (venv / ".complete").is_file():
            return venv
        python = _python312()
        if python is None:
            _unavailable("no python3.12 on PATH or under $PYENV_ROOT/versions (Harbor needs Python >= 3.12)")
        shutil.rmtree(venv, ignore_errors=True)  # an unfinished build
        made = subprocess.run([python, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            _unavailable(f"{python} -m venv failed: {made.stderr[-1500:]}")
        pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"harbor=={HARBOR_VERSION}"],
                             capture_output=True, text=True, timeout=900)
        if pip.returncode != 0:
            _unavailable(f"pip install harbor=={HARBOR_VERSION} failed (is PyPI reachable?): {pip.stderr[-1500:]}")
        (venv / ".complete").touch()
    return venv


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("exported")
    return [export_task(task, out / task.name) for task in TASKS]


def read_with_harbor(venv: Path, folders: list[Path]) -> list[dict]:
    result = subprocess.run([str(venv / "bin" / "python"), "-c", READ_WITH_HARBOR, *map(str, folders)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_harbors_loader_reads_each_export_with_our_user_network_and_steps(harbor_venv: Path,
                                                                          exported: list[Path]) -> None:
    for read in read_with_harbor(harbor_venv, exported):
        ours = load_task(read["folder"], quiet=True)
        assert read["name"] == ours.name
        assert (read["agent_user"], read["network_mode"], read["workdir"]) == ("agent", "no-network", "/app"), read
        assert read["verifier"] == "shared"  # the tests read the agent's machine, as ours do
        assert read["steps"] == ([step.name for step in ours.steps] if ours.multi_step else []), read


def test_harbors_loader_reads_the_stored_builtin_tasks_too(harbor_venv: Path) -> None:
    assert [read["name"] for read in read_with_harbor(harbor_venv, TASKS)] == [
        load_task(task, quiet=True).name for task in TASKS]


def test_harbors_lint_finds_nothing_in_the_exports(harbor_venv: Path, exported: list[Path]) -> None:
    """Harbor's default rules plus root-agent (the export names a non-root agent user). Ignored: shared-verifier,
    which says the tests run in the agent's machine; ours are written for that (they read its files and processes
    as root, running agent-written code only as the agent)."""
    result = subprocess.run([str(harbor_venv / "bin" / "harbor"), "lint", "--json", "--extend-select", "root-agent",
                             "--ignore", "shared-verifier", *map(str, exported)],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    assert (result.returncode, json.loads(result.stdout or "[]")) == (0, []), result.stdout + result.stderr

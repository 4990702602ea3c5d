"""Fixtures for the skyrl-viewer tests: real short training runs and a real ``skyrl eval`` results folder, a
running ``skyrl view``, headless Chromium.

Screenshots go to ``$SKYRL_TEST_ARTIFACTS/viewer`` when that variable is set, else to a pytest temporary
folder (``.../pytest-of-<user>/pytest-<n>/viewer-artifacts0``; the path is printed in the test report
header line ``viewer artifacts:``). The browser is Debian's ``chromium`` (or ``$SKYRL_CHROMIUM``) driven
by Playwright; where either is missing the browser tests skip, or fail under ``SKYRL_REQUIRE_BROWSER=1``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from viewer_files import SKYRL

HERE = Path(__file__).parent
TINY_RUN = ["--trainer", "fsdp_grpo", "--model", "tiny-random", "trainer.steps=2", "trainer.batch_size=1",
            "generator.n_samples_per_prompt=2", "trainer.micro_batch_tokens=1024", "trainer.eval_samples=2",
            "run.console=false"]
REVERSE_TEXT = ["--env", "reverse_text", "generator.max_tokens_per_turn=6", "generator.max_total_tokens=12"]
# tests/viewer/viewer_support.py scripts the roots' and children's first turns so the tree has two levels
RLM_TREE = ["--env", "rlm_repl", "engine.id=rlm_script_hf", "generator.id=rlm_tree", "generator.max_tokens_per_turn=120",
            "generator.max_total_tokens=400", "generator.max_context_length=4096", "env.max_turns=2",
            "env.worked_example=false", "env.subcalls.max_depth=2", "trainer.samples_per_step=1"]


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("SKYRL_TEST_ARTIFACTS")
    folder = Path(root) / "viewer" if root else tmp_path_factory.mktemp("viewer-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nviewer artifacts: {folder}")
    return folder


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real 2-step ``fsdp_grpo`` runs on tiny-random, trained side by side: ``reverse_text`` and an
    ``rlm_repl`` run with the ``rlm_tree`` generator whose roots have children and grandchildren."""
    pytest.importorskip("skyrl_trainers")
    base = tmp_path_factory.mktemp("viewer-runs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two runs share the cores
    commands = {
        "reverse_text": [str(SKYRL), "run", *REVERSE_TEXT, *TINY_RUN],
        "rlm_tree": [sys.executable, str(HERE / "train_run.py"), "run", *RLM_TREE, *TINY_RUN],
    }
    jobs = {name: subprocess.Popen([*command, f"run.output_dir={base / name}"], cwd=HERE, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for name, command in commands.items()}
    for name, job in jobs.items():
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, f"training run {name} failed:\n{output[-4000:]}"
    return {name: base / name for name in commands}


@pytest.fixture(scope="session")
def eval_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real ``skyrl eval`` results folder: tiny-random on two reverse_text tasks, two episodes each."""
    pytest.importorskip("skyrl_trainers")
    folder = tmp_path_factory.mktemp("viewer-eval") / "eval"
    command = [str(SKYRL), "eval", *REVERSE_TEXT, "--model", "tiny-random", "--engine", "hf", "--n-tasks", "2",
               "--samples-per-task", "2", "--show", "0", "--out", str(folder)]
    done = subprocess.run(command, cwd=HERE, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"skyrl eval failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return folder


class Viewer:
    """A ``skyrl view`` process serving some folders; ``url`` is its page."""

    def __init__(self, folders: list[Path]) -> None:
        self.process = subprocess.Popen([str(SKYRL), "view", *map(str, folders), "--port", "0"], text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        line = self.process.stdout.readline() if self.process.stdout else ""
        if " at http" not in line:
            self.close()
            raise AssertionError(f"skyrl view did not start: {line}{self.process.stdout.read() if self.process.stdout else ''}")
        self.url = line.split(" at ", 1)[1].split()[0]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[..., Viewer]]:
    """``serve(folder, ...)`` starts ``skyrl view`` on the folders; stopped after the test."""
    viewers: list[Viewer] = []

    def start(*folders: Path) -> Viewer:
        viewers.append(Viewer(list(folders)))
        return viewers[-1]

    yield start
    for viewer in viewers:
        viewer.close()


def chromium_path() -> str | None:
    chosen = os.environ.get("SKYRL_CHROMIUM")
    if chosen:
        return chosen if Path(chosen).is_file() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _no_browser(reason: str) -> None:
    if os.environ.get("SKYRL_REQUIRE_BROWSER") == "1":
        pytest.fail(f"SKYRL_REQUIRE_BROWSER=1 but the browser tests cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's package) through Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("Playwright for Python is not installed (pip install playwright)")
    executable = chromium_path()
    if executable is None:
        _no_browser("no Chromium found (apt-get install chromium, or set SKYRL_CHROMIUM)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; JavaScript errors on it fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"

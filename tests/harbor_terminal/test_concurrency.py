"""Many harbor_terminal episodes at once on docker: bounded live containers, isolated failures, one build per image.

Episodes run the way the generator runs them: several envs, each reset, their ``astep`` awaited
together with ``asyncio.gather``. The number of live containers is followed on the engine's own
event stream (every create and destroy of this process's sandbox containers, in order), so a
moment with one container too many cannot slip between two samples.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import docker
import pytest
from harbor_helpers import bash, builtin_row, write_task
from skyrl_harbor_terminal.env import HarborTerminalEnv
from skyrl_harbor_terminal.provision import task_image_tag
from skyrl_harbor_terminal.task import load_task
from skyrl_sandbox.backends.docker.client import DOCKER
from skyrl_sandbox.backends.docker.worker import owner_labels

SOLVE = "printf 'Hello, world!\\n' > /app/hello.txt"
PASS_SH = "#!/bin/bash\n[ -f /app/marker ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"


def remove_image(tag: str) -> None:
    try:
        DOCKER.shared_client().images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass


async def run_episodes(rows: list[dict[str, Any]], reply: str, **config: Any) -> list[tuple[Any, HarborTerminalEnv]]:
    """One single-turn episode per row, all at once; every env is closed afterwards."""
    envs = [HarborTerminalEnv(task=row, config=config) for row in rows]
    try:
        for env in envs:
            env.reset()
        results = await asyncio.gather(*(env.astep(reply) for env in envs))
    finally:
        for env in envs:
            env.close()
    return list(zip(results, envs, strict=True))


class ContainerWatch:
    """Follows the engine's live event stream of this process's sandbox containers: creates and destroys, in order.

    (The engine's event history is a short ring buffer, so events are followed live, not queried afterwards.)
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []  # (action, container id)
        self._stream = DOCKER.shared_client().api.events(decode=True, filters={
            "type": "container", "event": ["create", "destroy"],
            "label": [f"{key}={value}" for key, value in owner_labels().items()]})
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            for event in self._stream:
                self.events.append((event.get("Action", ""), event.get("id", "")))
        except Exception:  # noqa: BLE001 - the stream was closed
            pass

    def stop(self, expected: int) -> tuple[int, int]:
        """(most containers alive at once, containers created), once ``expected`` were created and destroyed."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(self._ended()) < expected:
            time.sleep(0.05)
        self._stream.close()
        live: set[str] = set()
        peak = 0
        for action, container in list(self.events):
            if action == "create":
                live.add(container)
            else:
                live.discard(container)
            peak = max(peak, len(live))
        return peak, sum(action == "create" for action, _ in self.events)

    def _ended(self) -> set[str]:
        created = {container for action, container in self.events if action == "create"}
        return {container for action, container in self.events if action == "destroy" and container in created}


async def test_six_episodes_with_two_machine_slots(docker_backend: str) -> None:
    hello = builtin_row("hello-world-file")
    watch = ContainerWatch()
    outcomes = await run_episodes([hello] * 6, bash(f"sleep 1; {SOLVE}", done=True), backend=docker_backend,
                                  max_live_machines=2, starts_per_second=50)
    peak, created = watch.stop(expected=6)
    for result, env in outcomes:
        assert "error" not in result.info, result.info["error"]
        assert result.terminated and result.reward == 1.0 and result.info["end_reason"] == "done"
        assert env.get_metrics()["passed"] == 1.0
    assert created == 6
    assert peak == 2, f"{peak} containers were alive at once with max_live_machines=2"


async def test_a_task_that_does_not_build_fails_only_its_own_episodes(docker_backend: str, tmp_path: Path) -> None:
    broken = write_task(tmp_path / "broken-image", {
        "environment/Dockerfile": "FROM skyrl-terminal-base:bookworm-1\nRUN exit 7\n", "tests/test.sh": PASS_SH},
        base_only=False)
    good = write_task(tmp_path / "good-image", {"tests/test.sh": PASS_SH}, base_only=False)
    rows = [broken, good, broken, good, good]
    outcomes = await run_episodes(rows, bash("touch /app/marker", done=True), backend=docker_backend,
                                  max_live_machines=2, build_logs=str(tmp_path / "logs"))
    for row, (result, env) in zip(rows, outcomes, strict=True):
        if row is broken:
            assert result.truncated and result.reward == 0.0
            assert "task test/broken-image: its image did not build" in result.info["error"]
            assert str(tmp_path / "logs") in result.info["error"]
            assert env.get_metrics()["container_errors"] == 1.0
        else:
            assert "error" not in result.info, result.info["error"]
            assert result.terminated and result.reward == 1.0
            assert env.get_metrics()["container_errors"] == 0.0


async def test_an_image_is_built_once_when_four_episodes_start_together(docker_backend: str, tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    row = write_task(tmp_path / "built-once", {
        "environment/Dockerfile": "FROM skyrl-terminal-base:bookworm-1\nWORKDIR /app\nRUN echo layer > /app/layer\n",
        "tests/test.sh": PASS_SH}, base_only=False)
    tag = task_image_tag(load_task(row["task_path"]))
    # The tag is a hash of the task's files, so an engine that outlives a test run (a reused CI machine) may
    # already hold it: start without it, and leave nothing behind.
    remove_image(tag)
    caplog.set_level(logging.DEBUG, logger="skyrl_harbor_terminal.builds")
    try:
        outcomes = await run_episodes([row] * 4, bash("cat /app/layer && touch /app/marker", done=True),
                                      backend=docker_backend, max_live_machines=4, build_logs=str(tmp_path / "logs"))
    finally:
        remove_image(tag)
    for result, _ in outcomes:
        assert "error" not in result.info, result.info["error"]
        assert result.reward == 1.0 and "layer" in result.observation[0]["content"]
    # images.build_image says "building <tag> from ..." when it builds and "<tag> is up to date ..." when it
    # finds the image already built: one call in all means one build.
    calls = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith(f"building {tag} from") or r.getMessage().startswith(f"{tag} is up to date")]
    assert len(calls) == 1 and calls[0].startswith(f"building {tag}"), calls
    [build_log] = (tmp_path / "logs").iterdir()
    assert "layer" in build_log.read_text()

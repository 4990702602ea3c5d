"""A real third-party OpenAI-compatible server on loopback: ``transformers serve`` on the ``tiny-random``
model (saved to a folder, so nothing is downloaded). Skips when the serving extras
(``transformers[serving]``: fastapi, uvicorn, openai) or ``skyrl-trainers`` are not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai_server import unused_port


@dataclass
class ServedModel:
    base_url: str
    folder: Path
    tokenizer: Any


def serving_available() -> bool:
    from transformers.utils.import_utils import is_serve_available

    return bool(is_serve_available())


@contextmanager
def transformers_serve(folder: Path, timeout_s: float = 120) -> Iterator[str]:
    """Run ``transformers serve FOLDER`` (CPU, offline) and yield its ``/v1`` base URL."""
    port = unused_port()
    cli = Path(sys.executable).with_name("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = folder.parent / "serve.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen([str(cli), "serve", str(folder), "--host", "127.0.0.1", "--port", str(port),
                                 "--device", "cpu"], stdout=log_file, stderr=subprocess.STDOUT, env=env)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(base_url + "/models", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"transformers serve did not start:\n{log.read_text()[-3000:]}") from None
                time.sleep(0.25)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def serve_tiny_random(folder: Path) -> Iterator[ServedModel]:
    """``transformers serve`` on ``tiny-random`` saved under ``folder``; skips the test without the extras."""
    pytest.importorskip("skyrl_trainers.models", reason="tiny-random is built by skyrl-trainers")
    if not serving_available():
        pytest.skip("transformers serve needs transformers[serving] (fastapi, uvicorn, openai)")
    from skyrl_trainers.models import build_tiny_random

    _, tokenizer = build_tiny_random(folder / "tiny-random")
    with transformers_serve(folder / "tiny-random") as base_url:
        yield ServedModel(base_url, folder / "tiny-random", tokenizer)

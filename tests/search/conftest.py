"""Shared fixtures of the skyrl-search tests.

``search_cache``: the built-in corpus and its BM25 index are built once per test session into a
temporary folder (``SKYRL_SEARCH_CACHE``), never into ``~/.cache``.

``retrieval_server``: the real retrieval server (``skyrl_search.server.create_app``) under uvicorn on
a free loopback port, in a thread (``skyrl_search.server.running_server``), around a retriever the
test chooses; stopped when the test ends (or earlier, to test a server that went down).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session", autouse=True)
def search_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("skyrl_search_cache")
    previous = os.environ.get("SKYRL_SEARCH_CACHE")
    os.environ["SKYRL_SEARCH_CACHE"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("SKYRL_SEARCH_CACHE", None)
    else:
        os.environ["SKYRL_SEARCH_CACHE"] = previous


@dataclass
class RunningServer:
    """A retrieval server on loopback: ``url`` is its ``/retrieve`` endpoint, ``base_url`` its root."""

    base_url: str
    _stack: ExitStack

    @property
    def url(self) -> str:
        return f"{self.base_url}/retrieve"

    def stop(self) -> None:
        """Stops the server and waits for it; afterwards nothing listens on its port."""
        self._stack.close()


@pytest.fixture
def retrieval_server() -> Iterator[Callable[..., RunningServer]]:
    """A factory: ``retrieval_server(retriever, **create_app_options) -> RunningServer``; all stop at teardown."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from skyrl_search.server import create_app, running_server

    stacks: list[ExitStack] = []

    def start(retriever: Any, **app_options: Any) -> RunningServer:
        stack = ExitStack()
        stacks.append(stack)
        base_url = stack.enter_context(running_server(create_app(retriever, **app_options)))
        return RunningServer(base_url, stack)

    yield start
    for stack in stacks:
        stack.close()

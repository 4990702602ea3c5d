"""pytest fixtures for plugin authors, shipped through the ``pytest11`` entry point.

* ``skyrl_plugin_manager``: a fresh plugin manager (built-ins + installed plugins) made the
  process-wide one for the test, restored afterwards.
* ``register_skyrl_plugin``: ``register_skyrl_plugin(obj)`` registers a module/object with
  ``@hookimpl`` functions for the duration of the test.
* ``scripted_engine``: ``scripted_engine(*replies, style="chatml")`` -> a :class:`ScriptedEngine`
  with a real small tokenizer (needs ``skyrl-core[test]``).
* ``skyrl_cli``: ``skyrl_cli("envs", "--json")`` runs the CLI in-process and returns the result.
* ``fresh_venv``: a new virtual environment (:class:`skyrl_core.testing.venv.FreshVenv`) to check
  that a plugin installs and works beside ``skyrl-core`` alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from skyrl_core.plugins import PluginManager, new_plugin_manager, set_plugin_manager
from skyrl_core.registry import Provider
from skyrl_core.testing.venv import FreshVenv


@pytest.fixture
def skyrl_plugin_manager() -> Iterator[PluginManager]:
    """A fresh skyrl plugin manager (core's built-ins + installed plugins), process-wide for this test.

    Registry lookups (``check_env("my_env")``, ``skyrl_core.get_registry()``) see it; the previous
    manager is restored afterwards, so plugins registered during the test do not leak.
    """
    pm = new_plugin_manager()
    previous = set_plugin_manager(pm)
    try:
        yield pm
    finally:
        set_plugin_manager(previous)


@pytest.fixture
def register_skyrl_plugin(skyrl_plugin_manager: PluginManager) -> Iterator[Callable[..., object]]:
    """``register_skyrl_plugin(obj, name="test-plugin", version="0.0.test")`` registers a module or object
    with ``@hookimpl`` functions as a plugin for this test only; ``name``/``version`` are the provider
    shown by ``skyrl envs``. Use it for an unpackaged plugin (an installed one is already loaded)."""
    added: list[object] = []

    def register(plugin: object, name: str = "test-plugin", version: str = "0.0.test") -> object:
        skyrl_plugin_manager.register_plugin(plugin, Provider(name, version))
        added.append(plugin)
        return plugin

    yield register
    for plugin in added:
        if skyrl_plugin_manager.is_registered(plugin):
            skyrl_plugin_manager.unregister_plugin(plugin)


@pytest.fixture
def scripted_engine() -> Callable[..., Any]:
    """``scripted_engine(*replies, style="chatml", default=None, logprob=-0.25, latency=0.0)`` returns a
    :class:`~skyrl_core.testing.scripted_engine.ScriptedEngine` that answers each ``generate`` call with the
    next reply (a string, or a function of the prompt ids), then ``default``, else raises.

    ``engine.tokenizer`` is a real small tokenizer with a ``"chatml"`` or ``"llama3"`` chat template, to
    pass as a generator's ``tokenizer``. Needs ``pip install 'skyrl-core[test]'`` (transformers).
    """
    from skyrl_core.testing.scripted_engine import ScriptedEngine
    from skyrl_core.testing.tokenizers import make_tokenizer

    def make(*replies: Any, style: str = "chatml", **kwargs: Any) -> ScriptedEngine:
        return ScriptedEngine(make_tokenizer(style), replies, **kwargs)

    return make


@pytest.fixture
def skyrl_cli(skyrl_plugin_manager: PluginManager) -> Callable[..., Any]:
    """``skyrl_cli("envs", "--json")`` runs the ``skyrl`` CLI in-process (on ``skyrl_plugin_manager``) and
    returns typer's ``Result``: ``exit_code``, ``output``, ``stdout``. Keyword arguments go to
    ``CliRunner.invoke`` (e.g. ``env={"COLUMNS": "200"}``)."""
    from typer.testing import CliRunner

    from skyrl_core.cli import build_app

    runner = CliRunner()

    def invoke(*args: str, **kwargs: Any) -> Any:
        return runner.invoke(build_app(), list(args), catch_exceptions=False, **kwargs)

    return invoke


@pytest.fixture
def fresh_venv(tmp_path: Any) -> FreshVenv:
    """A new empty virtual environment (:class:`skyrl_core.testing.venv.FreshVenv`): ``install(*paths)``,
    ``packages()``, ``skyrl(*args)``, ``run("pytest", ...)``, to check that a plugin installs and works
    beside ``skyrl-core`` alone. Installs need the package index (or local wheels)."""
    return FreshVenv(tmp_path / "venv")

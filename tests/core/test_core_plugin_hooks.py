"""How core calls plugin hooks: observers are guarded without touching pluggy's hook implementations, and
``entry_point_groups`` puts what other packages installed in a plugin's own entry-point groups in
``skyrl plugins``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from skyrl_core import hookimpl
from skyrl_core.registry import Provider


class Observer:
    def __init__(self) -> None:
        self.steps: list[int] = []

    @hookimpl(tryfirst=True)
    def on_train_step_end(self, step, metrics):
        self.steps.append(step)
        raise RuntimeError("step observer bug")


def test_observers_are_guarded_without_rewriting_pluggys_hook_implementations(skyrl_plugin_manager, caplog):
    plugin = Observer()
    assert skyrl_plugin_manager.register_plugin(plugin, Provider("skyrl-observer", "1.0"), name="skyrl-observer")
    (impl,) = [i for i in skyrl_plugin_manager.hook.on_train_step_end.get_hookimpls()
               if i.plugin_name.startswith("skyrl-observer")]
    assert impl.tryfirst and impl.argnames == ("step", "metrics")  # options and signature kept
    # pluggy holds the guarded function from the start; the plugin's own method is not a hook implementation
    assert impl.function != plugin.on_train_step_end and impl.function.__wrapped__ == plugin.on_train_step_end
    assert impl.plugin is not plugin
    with caplog.at_level(logging.WARNING, logger="skyrl_core.plugins"):
        assert skyrl_plugin_manager.hook.on_train_step_end(step=1, metrics={}) == []
        skyrl_plugin_manager.hook.on_train_step_end(step=2, metrics={})
    assert plugin.steps == [1, 2] and len(caplog.records) == 1
    (record,) = [r for r in skyrl_plugin_manager.records() if r.name == "skyrl-observer"]
    assert record.hooks == ["on_train_step_end"] and record.module == "Observer"
    skyrl_plugin_manager.unregister_plugin(plugin)
    assert skyrl_plugin_manager.hook.on_train_step_end.get_hookimpls() == []
    assert "skyrl-observer" not in [r.name for r in skyrl_plugin_manager.records()]


def test_plain_register_and_unregister_guard_and_remove_observers(skyrl_plugin_manager):
    plugin = Observer()  # as the progress bars register themselves, with pluggy's register/unregister
    skyrl_plugin_manager.register(plugin)
    skyrl_plugin_manager.hook.on_train_step_end(step=1, metrics={})
    skyrl_plugin_manager.unregister(plugin)
    skyrl_plugin_manager.hook.on_train_step_end(step=2, metrics={})
    assert plugin.steps == [1] and not skyrl_plugin_manager.is_registered(plugin)
    assert all(":observers" not in name for name, _ in skyrl_plugin_manager.list_name_plugin())


def test_observer_with_a_wrong_signature_leaves_nothing_registered(skyrl_plugin_manager):
    class Wrong:
        @hookimpl
        def register_envs(self, register):
            pass

        @hookimpl
        def on_rollout_end(self, trajectory, extra):
            pass

    plugin = Wrong()
    assert skyrl_plugin_manager.register_plugin(plugin, Provider("skyrl-wrong", "0")) is False
    assert not skyrl_plugin_manager.is_registered(plugin)
    assert not skyrl_plugin_manager.hook.on_rollout_end.get_hookimpls()
    assert all(impl.plugin is not plugin for impl in skyrl_plugin_manager.hook.register_envs.get_hookimpls())
    (failure,) = skyrl_plugin_manager.failures
    assert failure.name == "skyrl-wrong" and "extra" in failure.error


def test_misspelt_observer_is_still_an_unknown_hook(skyrl_plugin_manager):
    class Typo:
        @hookimpl
        def on_rollout_ended(self, trajectory):
            pass

    assert skyrl_plugin_manager.register_plugin(Typo(), Provider("skyrl-typo", "0")) is False
    assert "Did you mean 'on_rollout_end'?" in skyrl_plugin_manager.failures[0].error


# -- entry_point_groups -------------------------------------------------------------------------------


def write_distribution(root: Path, name: str, group: str, entry_points: dict[str, str]) -> None:
    """An installed-looking distribution ``name`` 0.1.0 (a dist-info folder in ``root``) declaring ``entry_points``
    in ``group``; put ``root`` on sys.path for importlib.metadata to find it."""
    info = root / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = "\n".join(f"{key} = {value}" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}\n")


class Extensible:
    @hookimpl
    def entry_point_groups(self):
        return ["skyrl_test.widgets"]


def test_plugins_lists_the_entry_points_installed_in_a_plugins_own_groups(skyrl_cli, register_skyrl_plugin,
                                                                          tmp_path, monkeypatch):
    write_distribution(tmp_path, "skyrl-widget-b", "skyrl_test.widgets", {"zeta": "widget_b:make"})
    write_distribution(tmp_path, "skyrl-widget-a", "skyrl_test.widgets", {"alpha": "widget_a:make"})
    monkeypatch.syspath_prepend(str(tmp_path))
    register_skyrl_plugin(Extensible(), name="skyrl-extensible", version="2.0")
    plugins = {p["name"]: p for p in json.loads(skyrl_cli("plugins").stdout)}
    assert plugins["skyrl-extensible"]["extensions"] == {"skyrl_test.widgets": [
        {"name": "alpha", "value": "widget_a:make", "provider": "skyrl-widget-a", "version": "0.1.0"},
        {"name": "zeta", "value": "widget_b:make", "provider": "skyrl-widget-b", "version": "0.1.0"}]}
    assert "entry_point_groups" in plugins["skyrl-extensible"]["hooks"]
    assert plugins["skyrl-reverse-text"]["extensions"] == {}  # a plugin without the hook


def test_a_raising_entry_point_groups_hook_is_logged_and_lists_nothing(skyrl_cli, register_skyrl_plugin, caplog):
    class Broken:
        @hookimpl
        def entry_point_groups(self):
            raise RuntimeError("groups exploded")

    register_skyrl_plugin(Broken(), name="skyrl-broken-groups")
    with caplog.at_level(logging.WARNING, logger="skyrl_core.plugins"):
        result = skyrl_cli("plugins")
    assert result.exit_code == 0
    (record,) = [p for p in json.loads(result.stdout) if p["name"] == "skyrl-broken-groups"]
    assert record["extensions"] == {} and record["error"] is None
    assert any("skyrl-broken-groups" in r.getMessage() and "groups exploded" in r.getMessage()
               for r in caplog.records)


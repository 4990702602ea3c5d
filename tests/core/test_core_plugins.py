"""Plugin discovery, attribution, duplicate ids, broken plugins, allow-list, dev modules, tracing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
from core_envs import TestEnvsPlugin
from skyrl_core import EnvSpec, hookimpl
from skyrl_core.plugins import new_plugin_manager
from skyrl_core.registry import Provider, RegistryError

SKYRL = [sys.executable, "-m", "skyrl_core.cli"]


def test_builtins_are_registered_through_the_hooks(skyrl_plugin_manager):
    registry = skyrl_plugin_manager.registry
    assert registry.get("generator", "default").provider.name == "skyrl-core"
    assert registry.get("engine", "openai").provider.name == "skyrl-core"


def test_installed_plugin_is_attributed_to_its_distribution(skyrl_plugin_manager):
    spec = skyrl_plugin_manager.registry.get("env", "reverse_text")
    assert spec.provider == Provider("skyrl-reverse-text", "0.1.0")
    assert spec.max_turns == 2 and spec.metadata()["needs_docker"] is False


def test_registered_plugin_appears_and_disappears(skyrl_plugin_manager, register_skyrl_plugin):
    plugin = register_skyrl_plugin(TestEnvsPlugin(), name="skyrl-test-envs", version="1.2.3")
    assert skyrl_plugin_manager.registry.get("env", "countdown").provider == Provider("skyrl-test-envs", "1.2.3")
    skyrl_plugin_manager.unregister_plugin(plugin)
    with pytest.raises(RegistryError, match="unknown env id 'countdown'"):
        skyrl_plugin_manager.registry.get("env", "countdown")


def test_same_id_from_two_distributions_fails_its_lookups_naming_both(skyrl_plugin_manager, register_skyrl_plugin):
    class Impostor:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="reverse_text", entry_point="x:Y"))

    register_skyrl_plugin(Impostor(), name="skyrl-impostor", version="9.9")
    with pytest.raises(RegistryError) as err:
        skyrl_plugin_manager.registry.get("env", "reverse_text")
    message = str(err.value)
    assert "'reverse_text' is registered twice" in message
    assert "skyrl-reverse-text 0.1.0" in message and "skyrl-impostor 9.9" in message


def test_unknown_id_suggests_the_closest_and_the_listing_command(skyrl_plugin_manager):
    with pytest.raises(RegistryError) as err:
        skyrl_plugin_manager.registry.get("env", "reverse_txt")
    assert "Did you mean 'reverse_text'?" in str(err.value) and "skyrl envs" in str(err.value)


def test_known_component_of_an_uninstalled_package_names_the_package():
    # without entry points the manager sees no installed plugin, whatever this venv holds
    with pytest.raises(RegistryError, match="pip install skyrl-harbor-terminal"):
        new_plugin_manager(entry_points=False).registry.get("env", "harbor_terminal")


def test_misspelt_hook_is_reported_with_did_you_mean_and_not_registered(skyrl_plugin_manager):
    typo = types.ModuleType("typo_plugin")
    typo.register_env = hookimpl(lambda register: None)  # missing "s"
    assert skyrl_plugin_manager.register_plugin(typo, Provider("typo", "0")) is False
    assert not skyrl_plugin_manager.is_registered(typo)
    (failure,) = skyrl_plugin_manager.failures
    assert "unknown hook 'register_env'. Did you mean 'register_envs'?" in failure.error


def test_plugin_whose_register_hook_raises_is_reported_not_fatal(skyrl_plugin_manager, register_skyrl_plugin):
    class Broken:
        @hookimpl
        def register_envs(self, register):
            raise ImportError("No module named 'torch_nightly'")

    register_skyrl_plugin(Broken(), name="skyrl-broken", version="0.1")
    registry = skyrl_plugin_manager.registry
    assert "reverse_text" in registry.ids("env")
    (failure,) = [r for r in skyrl_plugin_manager.records() if r.error]
    assert failure.name == "skyrl-broken" and "torch_nightly" in failure.error


def test_bad_spec_ids_are_rejected():
    with pytest.raises(RegistryError, match="lower snake case"):
        EnvSpec(id="Reverse-Text", entry_point="a:b")
    with pytest.raises(RegistryError, match="'module:attr'"):
        EnvSpec(id="ok", entry_point="no_colon")


def test_make_reports_a_broken_entry_point(skyrl_plugin_manager, register_skyrl_plugin):
    class Dangling:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="dangling", entry_point="no_such_module_xyz:Env"))

    register_skyrl_plugin(Dangling())
    assert "dangling" in skyrl_plugin_manager.registry.ids("env")  # listing is unaffected
    with pytest.raises(RegistryError, match="env 'dangling' failed to load.*no_such_module_xyz"):
        skyrl_plugin_manager.registry.make("env", "dangling")


def _skyrl(*args, **env):
    full_env = {**os.environ, **env}
    for key, value in env.items():
        if value is None:
            full_env.pop(key)
    return subprocess.run([*SKYRL, *args], capture_output=True, text=True, env=full_env, timeout=60)


def test_allow_list_loads_only_named_distributions():
    everything = json.loads(_skyrl("plugins").stdout)
    assert "skyrl-reverse-text" in {p["name"] for p in everything}
    none = json.loads(_skyrl("plugins", SKYRL_LOAD_PLUGINS="").stdout)
    assert none == []
    only = json.loads(_skyrl("plugins", SKYRL_LOAD_PLUGINS="skyrl-reverse-text").stdout)
    assert [p["name"] for p in only] == ["skyrl-reverse-text"]


def test_unpackaged_module_can_be_registered_for_development(tmp_path):
    (tmp_path / "my_dev_plugin.py").write_text(
        "from skyrl_core import EnvSpec, hookimpl\n"
        "@hookimpl\n"
        "def register_envs(register):\n"
        "    register(EnvSpec(id='dev_env', entry_point='my_dev_plugin:Env', description='in development'))\n")
    result = _skyrl("envs", "--json", SKYRL_PLUGIN_MODULES="my_dev_plugin",
                    PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    rows = {r["id"]: r for r in json.loads(result.stdout)}
    assert rows["dev_env"]["provider"] == "my_dev_plugin" and rows["dev_env"]["version"] == "dev"


def test_broken_installed_plugin_shows_in_plugins_with_its_error(tmp_path):
    (tmp_path / "my_broken_plugin.py").write_text("raise RuntimeError('plugin exploded on import')\n")
    result = _skyrl("plugins", SKYRL_PLUGIN_MODULES="my_broken_plugin", PYTHONPATH=str(tmp_path))
    (record,) = [p for p in json.loads(result.stdout) if p["name"] == "my_broken_plugin"]
    assert "plugin exploded on import" in record["error"]
    assert _skyrl("envs", SKYRL_PLUGIN_MODULES="my_broken_plugin", PYTHONPATH=str(tmp_path)).returncode == 0


def test_trace_switch_prints_hook_calls():
    result = _skyrl("envs", SKYRL_TRACE_HOOKS="1")
    assert "register_envs" in result.stderr


def test_fresh_manager_without_entry_points_has_only_builtins():
    pm = new_plugin_manager(entry_points=False)
    assert pm.registry.ids("env") == [] and pm.registry.ids("generator") == ["default"]

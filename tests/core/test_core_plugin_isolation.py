"""One bad plugin never breaks another: failed plugins are unregistered and reported once, id clashes
fail only the commands that use the id, observers that raise are logged once, and a broken
``register_commands`` leaves the built-in commands working."""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import pytest
from skyrl_core import EnvSpec, GeneratorSpec, hookimpl
from skyrl_core.generator import GeneratorConfig, MultiTurnGenerator
from skyrl_core.plugins import new_plugin_manager
from skyrl_core.registry import Provider

REPO = Path(__file__).resolve().parents[2]


class RaisingObserver:
    @hookimpl
    def on_rollout_end(self, trajectory):
        raise RuntimeError("observer bug")

    @hookimpl
    def on_train_step_end(self, step, metrics):
        raise RuntimeError("step observer bug")


async def test_raising_rollout_observer_never_fails_an_episode_and_warns_once(
        scripted_engine, register_skyrl_plugin, caplog):
    register_skyrl_plugin(RaisingObserver(), name="skyrl-bad-observer")
    engine = scripted_engine(default="<answer>a</answer>")
    gen = MultiTurnGenerator(GeneratorConfig(n_samples_per_prompt=2, max_turns=1), engine=engine,
                             tokenizer=engine.tokenizer, env_id="reverse_text")
    with caplog.at_level(logging.WARNING, logger="skyrl_core.plugins"):
        batch = await gen.generate([{"text": "a"}, {"text": "b"}])
    assert len(batch) == 4 and all(t.error is None for t in batch.trajectories)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "skyrl-bad-observer" in warnings[0] and "on_rollout_end" in warnings[0] and "observer bug" in warnings[0]


def test_raising_step_observer_is_ignored_and_the_others_still_run(skyrl_plugin_manager, register_skyrl_plugin,
                                                                   caplog):
    seen = []

    class GoodObserver:
        @hookimpl
        def on_train_step_end(self, step, metrics):
            seen.append(step)

    register_skyrl_plugin(RaisingObserver(), name="skyrl-bad-observer")
    register_skyrl_plugin(GoodObserver(), name="skyrl-good-observer")
    for step in (1, 2):
        skyrl_plugin_manager.hook.on_train_step_end(step=step, metrics={})
    assert seen == [1, 2]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["plugin skyrl-bad-observer"]


def test_misspelt_hook_leaves_later_plugins_loading_with_their_real_provider(skyrl_plugin_manager,
                                                                            register_skyrl_plugin):
    class Typo:
        @hookimpl
        def register_env(self, register):  # missing "s"
            raise AssertionError("never called")

    class Good:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="good_env", entry_point="x:Y"))

    register_skyrl_plugin(Typo(), name="skyrl-typo")
    register_skyrl_plugin(Good(), name="skyrl-good", version="1.0")
    assert skyrl_plugin_manager.registry.get("env", "good_env").provider == Provider("skyrl-good", "1.0")
    (failure,) = skyrl_plugin_manager.failures
    assert failure.name == "skyrl-typo" and "Did you mean 'register_envs'?" in failure.error


def test_hook_with_a_wrong_signature_is_reported_not_registered(skyrl_plugin_manager):
    class WrongSignature:
        @hookimpl
        def register_envs(self, register, extra):
            pass

    plugin = WrongSignature()
    assert skyrl_plugin_manager.register_plugin(plugin, Provider("skyrl-wrong", "0")) is False
    assert not skyrl_plugin_manager.is_registered(plugin)
    (failure,) = skyrl_plugin_manager.failures
    assert failure.name == "skyrl-wrong" and "extra" in failure.error


def test_plugin_whose_register_hook_raises_contributes_nothing_and_is_reported_once(skyrl_plugin_manager,
                                                                                     register_skyrl_plugin):
    class HalfBroken:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="half_env", entry_point="x:Y"))

        @hookimpl
        def register_generators(self, register):
            register(GeneratorSpec(id="half_gen", entry_point="x:Y"))
            raise RuntimeError("generator registration exploded")

    plugin = register_skyrl_plugin(HalfBroken(), name="skyrl-half")
    registry = skyrl_plugin_manager.registry
    assert "half_env" not in registry.ids("env") and "half_gen" not in registry.ids("generator")
    assert "reverse_text" in registry.ids("env")
    assert not skyrl_plugin_manager.is_registered(plugin)
    register_skyrl_plugin(_countdown_plugin(), name="skyrl-test-envs")  # a new plugin rebuilds the registry
    assert "countdown" in skyrl_plugin_manager.registry.ids("env")
    assert [f.name for f in skyrl_plugin_manager.failures] == ["skyrl-half"]


def test_clash_is_listed_with_both_providers_and_fails_only_commands_using_it(skyrl_cli, register_skyrl_plugin):
    class Impostor:
        @hookimpl
        def register_envs(self, register):
            register(EnvSpec(id="countdown", entry_point="x:Y", description="impostor"))

    register_skyrl_plugin(Impostor(), name="skyrl-impostor", version="9.9")
    register_skyrl_plugin(_countdown_plugin(), name="skyrl-test-envs", version="1.0")
    rows = json.loads(skyrl_cli("envs", "--json").stdout)
    clashing = sorted((r["provider"], r["clash"]) for r in rows if r["id"] == "countdown")
    assert clashing == [("skyrl-impostor", True), ("skyrl-test-envs", True)]
    result = skyrl_cli("plugins")
    (impostor,) = [p for p in json.loads(result.stdout) if p["name"] == "skyrl-impostor"]
    assert "'countdown' is registered twice" in impostor["clashes"][0]
    assert "clash: env id 'countdown' is registered twice" in result.stderr
    check = skyrl_cli("check", "countdown")
    assert check.exit_code == 2
    assert check.stdout == "" and check.stderr.startswith("error: env id 'countdown' is registered twice: by ")
    assert "skyrl-test-envs 1.0" in check.stderr and "skyrl-impostor 9.9" in check.stderr
    assert skyrl_cli("check", "reverse_text").exit_code == 0


def _countdown_plugin() -> object:
    from core_envs import TestEnvsPlugin

    return TestEnvsPlugin()


def test_raising_register_commands_leaves_builtin_commands_working(skyrl_cli, register_skyrl_plugin):
    class BadCommands:
        @hookimpl
        def register_commands(self, cli):
            raise RuntimeError("commands exploded")

    register_skyrl_plugin(BadCommands(), name="skyrl-bad-commands")
    result = skyrl_cli("plugins")
    assert result.exit_code == 0
    (record,) = [p for p in json.loads(result.stdout) if p["name"] == "skyrl-bad-commands"]
    assert "commands exploded" in record["error"]
    envs = skyrl_cli("envs")
    assert envs.exit_code == 0 and "1 plugin(s) failed to load; see `skyrl plugins`." in envs.stderr


def test_unknown_name_in_load_plugins_warns_with_did_you_mean(monkeypatch, caplog):
    monkeypatch.setenv("SKYRL_LOAD_PLUGINS", "skyrl-revers-text")
    with caplog.at_level(logging.WARNING, logger="skyrl_core.plugins"):
        pm = new_plugin_manager()
    assert pm.registry.ids("env") == []
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "'skyrl-revers-text'" in warning and "Did you mean 'skyrl-reverse-text'?" in warning


# -- installed for real: tiny distributions next to the tutorial plugin in one fresh venv ----------

PLUGINS = {
    "skyrl-typo": """
        @hookimpl
        def register_env(register):
            pass
    """,
    "skyrl-import-fails": """
        import torch_nightly_that_is_not_installed  # noqa: F401
    """,
    "skyrl-twin-a": """
        @hookimpl
        def register_envs(register):
            register(EnvSpec(id="twin", entry_point="skyrl_twin_a:Env"))
    """,
    "skyrl-twin-b": """
        @hookimpl
        def register_envs(register):
            register(EnvSpec(id="twin", entry_point="skyrl_twin_b:Env"))
    """,
    "skyrl-bad-observer": """
        @hookimpl
        def on_rollout_end(trajectory):
            raise RuntimeError("observer bug")
    """,
    "skyrl-bad-commands": """
        @hookimpl
        def register_commands(cli):
            raise RuntimeError("commands exploded")
    """,
}


def _write_distribution(root: Path, name: str, body: str) -> Path:
    module = name.replace("-", "_")
    folder = root / name
    folder.mkdir()
    (folder / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "0.1.0"

        [project.entry-points.skyrl]
        {module} = "{module}"
        """))
    (folder / f"{module}.py").write_text("from skyrl_core import EnvSpec, hookimpl\n" + textwrap.dedent(body))
    return folder


@pytest.mark.slow
def test_installed_bad_plugins_never_break_the_tutorial_plugin(fresh_venv, tmp_path):
    fresh_venv.install(REPO / "core", "setuptools>=70.1")  # a setuptools that builds wheels without `wheel`
    folders = [_write_distribution(tmp_path, name, body) for name, body in PLUGINS.items()]
    fresh_venv.install("--no-deps", "--no-build-isolation", REPO / "examples" / "reverse_text", *folders)

    for bad in PLUGINS:  # each bad plugin next to the good one, then all of them at once
        env = {"SKYRL_LOAD_PLUGINS": f"skyrl-reverse-text,{bad}"}
        envs = fresh_venv.skyrl_json("envs", env=env)
        assert ("reverse_text", "skyrl-reverse-text") in [(e["id"], e["provider"]) for e in envs], bad
        rollout = fresh_venv.skyrl("rollout", "--env", "reverse_text", "--oracle", "--n-tasks", "2",
                                   "--out", str(tmp_path / f"oracle-{bad}.jsonl"), env=env)
        assert rollout.returncode == 0 and "oracle solved all 2 task(s)" in rollout.stdout, (bad, rollout.stderr)

    plugins = fresh_venv.skyrl("plugins")
    assert plugins.returncode == 0, plugins.stderr
    errors = {p["name"]: p["error"] for p in json.loads(plugins.stdout)}
    assert errors["skyrl-reverse-text"] is None and errors["skyrl-bad-observer"] is None
    assert "Did you mean 'register_envs'?" in errors["skyrl-typo"]
    assert "torch_nightly_that_is_not_installed" in errors["skyrl-import-fails"]
    assert "commands exploded" in errors["skyrl-bad-commands"]
    assert "clash: env id 'twin' is registered twice" in plugins.stderr

    envs = fresh_venv.skyrl("envs")
    assert envs.returncode == 0 and "3 plugin(s) failed to load; see `skyrl plugins`." in envs.stderr
    assert "twin (CLASH)" in envs.stdout and "reverse_text" in envs.stdout
    check = fresh_venv.skyrl("check", "reverse_text")
    assert check.returncode == 0 and "0 failed" in check.stdout, check.stdout + check.stderr
    twin = fresh_venv.skyrl("check", "twin")
    assert twin.returncode == 2 and "Traceback" not in twin.stderr
    assert twin.stderr.strip().startswith("error: env id 'twin' is registered twice: by skyrl-twin-")

    observed = fresh_venv.run("python", "-c", "from skyrl_core.plugins import get_plugin_manager\n"
                              "from skyrl_core.trajectory import Trajectory\n"
                              "for _ in range(3): get_plugin_manager().hook.on_rollout_end(trajectory=Trajectory())",
                              env={"SKYRL_LOAD_PLUGINS": "skyrl-bad-observer"})
    assert observed.returncode == 0, observed.stderr
    assert observed.stderr.count("plugin skyrl-bad-observer: its on_rollout_end hook raised RuntimeError") == 1

    typo = fresh_venv.skyrl("envs", env={"SKYRL_LOAD_PLUGINS": "skyrl-reverse-txt"})
    assert "Did you mean 'skyrl-reverse-text'?" in typo.stderr

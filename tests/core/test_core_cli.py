"""The skyrl CLI: plugins JSON, listings, check, rollout, run, and listing staying light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from core_envs import ScriptedEnginePlugin, TestEnvsPlugin
from skyrl_core.trajectory import read_jsonl


def test_listing_tables_and_json(skyrl_cli, register_skyrl_plugin):
    register_skyrl_plugin(TestEnvsPlugin(), name="skyrl-test-envs", version="1.0")
    table = skyrl_cli("envs", env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "countdown" in table.output and "skyrl-test-envs 1.0" in table.output
    rows = {r["id"]: r for r in json.loads(skyrl_cli("envs", "--json").output)}
    assert rows["countdown"]["max_turns"] == 3 and rows["reverse_text"]["provider"] == "skyrl-reverse-text"
    engines = {r["id"] for r in json.loads(skyrl_cli("engines", "--json").output)}
    assert "openai" in engines
    generators = json.loads(skyrl_cli("generators", "--json").output)
    assert {"id": "default", "provider": "skyrl-core"}.items() <= generators[0].items()


def test_plugins_json_lists_hooks(skyrl_cli):
    plugins = json.loads(skyrl_cli("plugins").output)
    (reverse,) = [p for p in plugins if p["name"] == "skyrl-reverse-text"]
    assert reverse["hooks"] == ["register_envs", "register_probes"] and reverse["error"] is None
    assert any(p["name"] == "skyrl-core" for p in json.loads(skyrl_cli("plugins", "--all").output))


def test_listing_imports_no_heavy_module():
    code = ("import sys; from skyrl_core.cli import build_app; from typer.testing import CliRunner;"
            "r = CliRunner().invoke(build_app(), ['envs']); assert r.exit_code == 0, r.output;"
            "heavy = [m for m in ('torch', 'transformers', 'vllm', 'skyrl_reverse_text.env', 'httpx') if m in sys.modules];"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_check_passes_a_good_env_and_reports_each_check(skyrl_cli):
    result = skyrl_cli("check", "reverse_text")
    assert result.exit_code == 0
    assert "PASS  gold[row 1] (train-0)" in result.output and "PASS  action:huge" in result.output
    assert "0 failed" in result.output


def test_check_unknown_env_suggests(skyrl_cli):
    result = skyrl_cli("check", "revers_text")
    assert result.exit_code == 2 and "Did you mean 'reverse_text'?" in result.output


def test_rollout_writes_trajectories_and_prints_a_summary(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    out = tmp_path / "roll.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "--model", "llama3",
                       "--n-tasks", "3", "--samples", "2", "--out", str(out), "env.max_turns=1")
    assert result.exit_code == 0, result.output
    trajectories = list(read_jsonl(out))
    assert len(trajectories) == 6 and all(len(t.turns) == 1 for t in trajectories)
    assert "reward/mean" in result.output and "wrote 6 trajectories" in result.output


def test_rollout_bad_override_names_the_key(skyrl_cli, register_skyrl_plugin):
    register_skyrl_plugin(ScriptedEnginePlugin())
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "env.max_turnz=1")
    assert result.exit_code == 2 and "env.max_turnz: unknown key" in result.output


def test_rollout_bad_task_file_names_the_row(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"text": "abc"}\n[1, 2]\n')
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "--tasks", str(tasks))
    assert result.exit_code == 2 and "row 2 must be a JSON object" in result.output


def test_run_with_unknown_trainer_points_to_listing(skyrl_cli):
    result = skyrl_cli("run", "--env", "reverse_text", "--trainer", "fsdp_grpoo")
    assert result.exit_code == 2
    assert "unknown trainer id 'fsdp_grpoo'" in result.output and "skyrl trainers" in result.output


def test_plugins_can_add_commands(skyrl_cli, register_skyrl_plugin):
    from skyrl_core import hookimpl

    class Commands:
        @hookimpl
        def register_commands(self, cli):
            @cli.command("hello")
            def hello() -> None:
                """Say hello."""
                print("hello from a plugin")

    register_skyrl_plugin(Commands())
    assert skyrl_cli("hello").output.strip() == "hello from a plugin"


def test_rollout_takes_the_engine_from_the_config_file_unless_given(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    config = tmp_path / "run.yaml"
    config.write_text("engine: {id: scripted, model: llama3}\n")
    out = tmp_path / "roll.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--config", str(config), "--n-tasks", "1",
                       "--out", str(out), "env.max_turns=1")
    assert result.exit_code == 0, result.output
    assert len(list(read_jsonl(out))) == 1
    result = skyrl_cli("rollout", "--env", "reverse_text", "--config", str(config), "--engine", "no_such_engine",
                       "--out", str(tmp_path / "other.jsonl"))
    assert result.exit_code == 2 and "no_such_engine" in result.output


def test_version_lists_core_and_each_plugin_distribution(skyrl_cli):
    from importlib import metadata

    result = skyrl_cli("--version")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"skyrl-core {metadata.version('skyrl-core')} (Python ")
    assert f"  skyrl-reverse-text {metadata.version('skyrl-reverse-text')}" in lines  # an installed plugin


def test_a_malformed_config_file_names_the_file_and_line(skyrl_cli, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  max_turns: 3\n trainer: {lr: 1\n")
    result = skyrl_cli("run", "--env", "reverse_text", "--trainer", "fsdp_grpo", "--config", str(config))
    assert result.exit_code == 2
    assert f"{config}:3:2: config file is not valid YAML" in result.output and "<unicode string>" not in result.output


def test_print_config_prints_the_resolved_yaml_and_builds_nothing(skyrl_cli, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    result = skyrl_cli("run", "--env", "reverse_text", "--trainer", "fsdp_grpo", "--print-config",
                       "trainer.steps=7", "env.max_turns=1")
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert set(config) == {"env", "generator", "engine", "trainer", "run"}
    assert config["trainer"]["steps"] == 7 and config["trainer"]["lr"] == 1e-6  # an override and a default
    assert config["env"] == {**config["env"], "id": "reverse_text", "max_turns": 1}
    assert config["engine"]["id"] == "hf" and config["generator"]["id"] == "default"
    assert list(tmp_path.iterdir()) == []  # no run folder


def test_rollout_and_eval_print_their_config_without_an_engine(skyrl_cli, tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    for command in ("rollout", "eval"):
        result = skyrl_cli(command, "--env", "reverse_text", "--engine", "no_engine_loaded_here", "--print-config",
                           "generator.max_tokens_per_turn=9")
        assert result.exit_code == 2 and "unknown engine id 'no_engine_loaded_here'" in result.output
        result = skyrl_cli(command, "--env", "reverse_text", "--print-config", "generator.max_tokens_per_turn=9")
        assert result.exit_code == 0, result.output
        config = yaml.safe_load(result.stdout)
        assert "trainer" not in config and config["generator"]["max_tokens_per_turn"] == 9
    assert list(tmp_path.iterdir()) == []


def test_run_without_env_or_trainer_names_the_flag(skyrl_cli):
    result = skyrl_cli("run", "--trainer", "fsdp_grpo")
    assert result.exit_code == 2 and "--env is required (see `skyrl envs`)" in result.output


def test_run_without_trainer_takes_the_only_installed_one_and_says_so(skyrl_cli):
    import yaml

    result = skyrl_cli("run", "--env", "reverse_text", "--print-config")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["trainer"]["id"] == "fsdp_grpo"
    assert "trainer: fsdp_grpo (the only one installed; --trainer chooses another)" in result.stderr


def test_run_without_trainer_is_an_error_when_none_or_several_are_installed(skyrl_cli, skyrl_plugin_manager,
                                                                            monkeypatch):
    from skyrl_core.registry import TrainerSpec

    trainers = skyrl_plugin_manager.registry.specs["trainer"]
    monkeypatch.setitem(trainers, "other_grpo", TrainerSpec(id="other_grpo", entry_point="nowhere:Trainer"))
    result = skyrl_cli("run", "--env", "reverse_text", "--print-config", env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--trainer is required (see `skyrl trainers`; 2 are installed: fsdp_grpo, other_grpo)" in result.output
    monkeypatch.setitem(skyrl_plugin_manager.registry.specs, "trainer", {})
    result = skyrl_cli("run", "--env", "reverse_text", "--print-config", env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--trainer is required (see `skyrl trainers`; none is installed; skyrl-trainers provides fsdp_grpo)" \
        in result.output


def test_an_unknown_option_that_is_a_config_field_suggests_the_override(skyrl_cli):
    result = skyrl_cli("run", "--env", "reverse_text", "--steps", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "No such option: --steps" in result.output and "trainer.steps=2" in result.output
    result = skyrl_cli("eval", "--env", "reverse_text", "--max-turns=3", env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "env.max_turns=3" in result.output
    result = skyrl_cli("run", "--stepz", "2", env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "No such option: --stepz" in result.output and "=2" not in result.output


def test_rollout_refuses_to_overwrite_its_out_file_unless_told(skyrl_cli, tmp_path):
    out = tmp_path / "rollouts.jsonl"
    out.write_text("earlier results\n")
    oracle = ("rollout", "--env", "reverse_text", "--oracle", "--n-tasks", "1", "--out", str(out))
    result = skyrl_cli(*oracle, env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert f"{out} already exists; choose another file with --out PATH, or pass --overwrite" in result.output
    assert out.read_text() == "earlier results\n"
    result = skyrl_cli(*oracle, "--overwrite")
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 1 and f"wrote 1 oracle episodes to {out}" in result.output
    result = skyrl_cli("rollout", "--env", "reverse_text", "--oracle", "--out", str(tmp_path), "--overwrite")
    assert result.exit_code == 2 and f"--out {tmp_path} is a folder" in result.output


def test_the_example_run_config_resolves(skyrl_cli, tmp_path, monkeypatch):
    import yaml

    example = Path(__file__).resolve().parents[2] / "examples" / "configs" / "my_run.yaml"
    monkeypatch.chdir(tmp_path)
    result = skyrl_cli("run", "--print-config", "--config", str(example))
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert config["env"]["id"] == "reverse_text" and config["trainer"]["id"] == "fsdp_grpo"
    assert config["trainer"]["model"] == "tiny-random" and config["generator"]["n_samples_per_prompt"] == 4
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_envs_table_fits_80_columns_and_keeps_metadata_short(skyrl_cli):
    result = skyrl_cli("envs", env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(line for line in lines if len(line) > 80)
    # one block per env between the rules: id and package on the left, description and metadata on the right
    blocks = "\n".join(lines).split("├")
    (reverse,) = [block for block in blocks if "│ reverse_text " in block]
    assert "skyrl-reverse-text" in reverse and "max_turns=2, reward=0..1" in reverse
    (rlm,) = [block for block in blocks if "│ rlm_repl " in block]
    assert len(rlm.strip("─┼┤\n").splitlines()) <= 6  # the issue saw 30 lines for this row at 80 columns
    assert "run_defaults" not in result.stdout and "eval_splits" not in result.stdout  # dicts: in --json only
    rows = {row["id"]: row for row in json.loads(skyrl_cli("envs", "--json").output)}
    assert "run_defaults" in rows["reverse_text"] and "eval_splits" in rows["reverse_text"]


def test_listing_metadata_is_one_short_line_per_row():
    from skyrl_core.cli import compact_metadata

    row = {"id": "sql", "provider": "skyrl-sql", "version": "0.1", "description": "SQL", "clash": False,
           "max_turns": 5, "reward_range": [-1.0, 1.0], "catalog": "pkg.catalog:entries", "needs_network": False,
           "needs_docker": True, "default_generator": None, "stop": ["</sql>", "</solution>"],
           "run_defaults": {"env": {"max_turns": 2}}, "eval_splits": {"train": "test"}}
    assert compact_metadata(row) == "max_turns=5, reward=-1..1, catalog, needs_docker, stop=</sql>|</solution>"

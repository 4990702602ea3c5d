"""Plugin authors' tools: `skyrl new env|generator` scaffolds that work as generated, documented
pytest11 fixtures, and `skyrl rollout --samples` never overriding a config file."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from core_envs import ScriptedEnginePlugin
from skyrl_core.scaffold import ScaffoldError, scaffold_env, scaffold_generator
from skyrl_core.trajectory import read_jsonl

REPO = Path(__file__).resolve().parents[2]
FIXTURES = ("skyrl_plugin_manager", "register_skyrl_plugin", "scripted_engine", "skyrl_cli", "fresh_venv")


def assert_valid_distribution(root: Path, dist: str, package: str, module: str, hook: str) -> None:
    """``root`` holds a parseable pyproject for ``dist`` and valid Python for ``package``."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == dist
    assert pyproject["project"]["dependencies"] == ["skyrl-core>=0.1"]
    assert list(pyproject["project"]["entry-points"]["skyrl"].values()) == [package]
    sources = {path: path.read_text() for path in root.rglob("*.py")}
    assert set(sources) == {root / "src" / package / "__init__.py", root / "src" / package / f"{module}.py",
                            root / "tests" / f"test_{package.removeprefix('skyrl_')}.py"}
    for path, source in sources.items():
        ast.parse(source, filename=str(path))
        assert "__" + "PKG__" not in source and "__" + "CLASS__" not in source, path
    assert f"def {hook}(register: Register) -> None:" in sources[root / "src" / package / "__init__.py"]
    readme = (root / "README.md").read_text()
    assert f"# {dist}" in readme and "pip install -e ." in readme


def test_new_env_writes_a_valid_distribution(skyrl_cli, tmp_path):
    target = tmp_path / "countdown-plugin"
    result = skyrl_cli("new", "env", "count-down", "--dir", str(target))
    assert result.exit_code == 0, result.output
    assert "created skyrl-count-down" in result.output and "skyrl check count_down" in result.output
    assert_valid_distribution(target, "skyrl-count-down", "skyrl_count_down", "env", "register_envs")
    env_source = (target / "src" / "skyrl_count_down" / "env.py").read_text()
    assert "class CountDownEnv(TextEnv):" in env_source and "class CountDownConfig(EnvConfig):" in env_source
    assert 'id="count_down"' in (target / "src" / "skyrl_count_down" / "__init__.py").read_text()


def test_new_generator_writes_a_valid_distribution(skyrl_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = skyrl_cli("new", "generator", "careful")
    assert result.exit_code == 0, result.output
    root = tmp_path / "skyrl-careful"
    assert_valid_distribution(root, "skyrl-careful", "skyrl_careful", "generator", "register_generators")
    assert "class CarefulGenerator(MultiTurnGenerator):" in (root / "src" / "skyrl_careful" / "generator.py").read_text()


@pytest.mark.parametrize(("name", "message"), [
    ("Count", "invalid name 'Count'"), ("2048", "invalid name '2048'"), ("a__b", "invalid name 'a__b'"),
    ("skyrl-foo", "without the 'skyrl' prefix"), ("class", "invalid name 'class'"),
    ("text", "would shadow one of skyrl-core's"),
])
def test_new_refuses_invalid_names(skyrl_cli, tmp_path, name, message):
    result = skyrl_cli("new", "env", name, "--dir", str(tmp_path / "x"))
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "x").exists()


def test_new_generator_refuses_names_that_shadow_cores(tmp_path):
    for name in ("default", "multi-turn"):
        with pytest.raises(ScaffoldError, match="would shadow"):
            scaffold_generator(name, tmp_path / name)
    assert not list(tmp_path.iterdir())


def test_new_refuses_an_existing_folder_and_leaves_it_alone(skyrl_cli, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result = skyrl_cli("new", "generator", "careful", "--dir", str(tmp_path))
    assert result.exit_code == 2 and f"{tmp_path} already exists" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    with pytest.raises(ScaffoldError, match="already exists"):
        scaffold_env("countdown", tmp_path)


def test_generated_env_passes_check_env_in_process(tmp_path, skyrl_plugin_manager, register_skyrl_plugin,
                                                   monkeypatch):
    from skyrl_core.testing import check_env

    scaffold_env("adder", tmp_path / "adder")
    monkeypatch.syspath_prepend(str(tmp_path / "adder" / "src"))
    import skyrl_adder

    register_skyrl_plugin(skyrl_adder, name="skyrl-adder")
    report = check_env("adder", n_tasks=0)
    assert not report.failed and "gold[row 50]" in report.passed


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "name", "listing"), [("env", "countdown", "envs"),
                                                       ("generator", "careful", "generators")])
def test_generated_package_installs_beside_core_alone_and_passes_its_tests(fresh_venv, tmp_path, kind, name,
                                                                          listing):
    target = (scaffold_env if kind == "env" else scaffold_generator)(name, tmp_path / name)
    fresh_venv.install(REPO / "core", "pytest")
    fresh_venv.install(target)
    packages = fresh_venv.packages()
    assert {"skyrl-core", f"skyrl-{name}", "pytest"} <= packages
    assert not packages & {"torch", "transformers", "tokenizers"}
    rows = fresh_venv.skyrl_json(listing)
    assert {(row["id"], row["provider"]) for row in rows} >= {(name, f"skyrl-{name}")}
    if kind == "env":
        check = fresh_venv.skyrl("check", name, "--n-tasks", "0")
        assert check.returncode == 0 and "0 failed" in check.stdout, check.stdout + check.stderr
    tests = fresh_venv.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target / "tests"))
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_pytest_fixtures_shows_a_docstring_for_every_skyrl_fixture(tmp_path):
    (tmp_path / "test_nothing.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for fixture in FIXTURES:
        (index,) = [i for i, line in enumerate(lines) if line.startswith(f"{fixture} ")]
        assert "no docstring available" not in lines[index + 1], fixture
    assert "scripted_engine(*replies, style=" in out.stdout


@pytest.mark.parametrize(("flag", "expected"), [((), 3), (("--samples", "2"), 2)])
def test_rollout_samples_come_from_the_config_file_unless_given(skyrl_cli, register_skyrl_plugin, tmp_path,
                                                                flag, expected):
    register_skyrl_plugin(ScriptedEnginePlugin())
    config = tmp_path / "run.yaml"
    config.write_text("engine: {id: scripted, model: llama3}\ngenerator: {n_samples_per_prompt: 3}\n")
    out = tmp_path / "roll.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--config", str(config), "--n-tasks", "1",
                       "--out", str(out), *flag, "env.max_turns=1")
    assert result.exit_code == 0, result.output
    assert len(list(read_jsonl(out))) == expected


def test_rollout_without_samples_anywhere_runs_one_episode_per_task(skyrl_cli, register_skyrl_plugin, tmp_path):
    register_skyrl_plugin(ScriptedEnginePlugin())
    out = tmp_path / "roll.jsonl"
    result = skyrl_cli("rollout", "--env", "reverse_text", "--engine", "scripted", "--n-tasks", "2",
                       "--out", str(out), "env.max_turns=1")
    assert result.exit_code == 0, result.output
    assert len(list(read_jsonl(out))) == 2

"""scripts/setup.sh as a user runs it: --help, the plan of each mode, and --undo (planned, and for real on a
state file that names only temporary folders, so no real Docker Engine is touched)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"
HEADER = "# harbor_terminal settings of this machine, written by scripts/setup.sh: RUN steps of task image"


def setup_sh(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKYRL_VENV": str(venv)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_help_explains_the_modes(tmp_path: Path) -> None:
    result = setup_sh(tmp_path / "venv", "--help")
    assert result.returncode == 0, result.stderr
    for word in ("train", "all", "--plan", "--undo", "skyrl run --env rlm_repl", str(tmp_path / "venv")):
        assert word in result.stdout
    assert not (tmp_path / "venv").exists()


def test_unknown_argument_is_an_error_naming_it(tmp_path: Path) -> None:
    result = setup_sh(tmp_path / "venv", "--steps")
    assert result.returncode == 2
    assert "unknown argument '--steps'" in result.stderr


def test_train_plan_sets_up_no_docker(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = setup_sh(venv, "train", "--plan")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "scripts/setup.sh train: the plan"
    assert any(line.startswith("  venv:    create ") and "skyrl-rlm-repl" in line for line in lines)
    assert not any(line.startswith(("  docker:", "  images:")) for line in lines)
    assert "dockerd" not in result.stdout
    assert f"rm -rf {venv}" in result.stdout
    assert not venv.exists()  # a plan changes nothing


def test_full_plan_names_the_engine_and_images(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result = setup_sh(venv, "--plan")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "scripts/setup.sh all: the plan"
    docker = [line for line in lines if line.startswith("  docker:")]
    assert len(docker) == 1  # the engine it uses, the dockerd it starts, or why the docker tests will skip
    assert any(line.startswith("  images:") and "skyrl-sandbox-base" in line for line in lines)
    assert f"SKYRL_VENV={venv} bash scripts/setup.sh --undo" in result.stdout
    assert setup_sh(venv, "test", "--plan").stdout == result.stdout
    assert not venv.exists()


def write_state(venv: Path, *lines: str) -> None:
    venv.mkdir()
    (venv / "skyrl-setup.state").write_text("".join(f"{line}\n" for line in lines))


def test_undo_plan_names_what_it_would_stop_and_remove(tmp_path: Path) -> None:
    venv, engine, settings = tmp_path / "venv", tmp_path / "engine", tmp_path / "harbor.toml"
    engine.mkdir()
    (engine / "dockerd.pid").write_text(str(os.getpid()))  # a live process that is no dockerd: never stopped
    settings.write_text(f"{HEADER}\nbuild_network = true\n")
    write_state(venv, "apt bubblewrap", f"dockerd {engine}", f"image skyrl-sandbox-base:bookworm-1 unix://{engine}/docker.sock",
                "image skyrl-terminal-base:bookworm-1 unix:///nowhere.sock", f"settings {settings}")
    result = setup_sh(venv, "--undo", "--plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"would remove {engine} (the engine's data" in out
    assert "would stop" not in out
    assert "skyrl-sandbox-base" not in out  # it goes with the engine's data
    assert "would remove the image skyrl-terminal-base:bookworm-1 from the engine at unix:///nowhere.sock" in out
    assert f"would remove {settings}" in out
    assert "apt-get remove bubblewrap" in out
    assert f"rm -rf {venv}" in out
    assert engine.is_dir() and settings.exists() and (venv / "skyrl-setup.state").read_text().count("\n") == 5


def test_undo_removes_only_what_setup_recorded(tmp_path: Path) -> None:
    venv, engine = tmp_path / "venv", tmp_path / "engine"
    ours, changed, unrecorded = tmp_path / "ours.toml", tmp_path / "changed.toml", tmp_path / "unrecorded.toml"
    (engine / "data").mkdir(parents=True)
    ours.write_text(f"{HEADER}\nbuild_network = true\n")
    changed.write_text("build_network = false\n")
    unrecorded.write_text(f"{HEADER}\nbuild_network = true\n")
    write_state(venv, "apt docker.io", f"dockerd {engine}", f"settings {ours}", f"settings {changed}")
    result = setup_sh(venv, "--undo")
    assert result.returncode == 0, result.stderr
    assert not engine.exists() and not ours.exists()
    assert changed.exists() and unrecorded.exists()
    assert f"{changed} was changed since setup wrote it: left as it is" in result.stdout
    assert (venv / "skyrl-setup.state").read_text() == "apt docker.io\n"
    assert "apt-get remove docker.io" in result.stdout


def test_undo_stops_the_engine_it_started(tmp_path: Path) -> None:
    """A process named dockerd (a copy of sleep) whose pid file is in the recorded folder is stopped, then the folder goes."""
    engine, fake = tmp_path / "engine", tmp_path / "bin" / "dockerd"
    engine.mkdir()
    fake.parent.mkdir()
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    process = subprocess.Popen([str(fake), "120"])
    try:
        (engine / "dockerd.pid").write_text(str(process.pid))
        write_state(tmp_path / "venv", f"dockerd {engine}")
        planned = setup_sh(tmp_path / "venv", "--undo", "--plan")
        assert f"would stop the Docker Engine this script started (dockerd, pid {process.pid})" in planned.stdout
        assert process.poll() is None
        result = setup_sh(tmp_path / "venv", "--undo")
        assert result.returncode == 0, result.stderr
        assert f"- stopping the Docker Engine this script started (dockerd, pid {process.pid})" in result.stdout
        assert process.wait(timeout=10) == -signal.SIGTERM
        assert not engine.exists()
    finally:
        process.kill()

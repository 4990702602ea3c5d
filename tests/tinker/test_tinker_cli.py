"""``skyrl-tinker serve`` as a user runs it: a subprocess on loopback, reached by the real client."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import tinker
from skyrl_tinker.cli import build_app
from typer.testing import CliRunner


@contextlib.contextmanager
def _serve(tmp_path, *args: str, env: dict[str, str] | None = None, key: str | None = None
           ) -> Iterator[tuple[str, list[str]]]:
    """``skyrl-tinker serve`` in a subprocess; yields its URL and, once it has stopped, its output lines
    (the list fills in when the block ends)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-c", "from skyrl_tinker.cli import main; main()", "serve", "--port", str(port),
               "--checkpoint-dir", str(tmp_path / "checkpoints"), *args]
    proc = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    output: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": key or ""}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"server did not start: {proc.stdout.read() if proc.poll() is not None else 'timeout'}")
            time.sleep(0.2)
        yield url, output
    finally:
        proc.terminate()
        output += proc.communicate(timeout=30)[0].splitlines()


def test_serve_command_with_api_key(tmp_path):
    with _serve(tmp_path, env={"SKYRL_TINKER_API_KEY": "tml-secret"}, key="tml-secret") as (url, output):
        denied = httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": "tml-wrong"})
        assert denied.status_code == 401 and "--api-key" in denied.json()["detail"]
        service = tinker.ServiceClient(base_url=url, api_key="tml-secret")
        models = service.get_server_capabilities().supported_models
        assert [m.model_name for m in models] == ["tiny-random"]
        service.close("success")
    assert any("one shared API key" in line for line in output), output


def test_serve_command_with_a_key_per_tenant(tmp_path):
    keys = {"alice": ["tml-alice-0123456789abcdef", "tml-alice-second-key-0000"], "bob": ["tml-bob-0123456789abcdef00"]}
    (tmp_path / "keys").write_text("# tenant key\n\nalice tml-alice-0123456789abcdef\n"
                                   "bob   tml-bob-0123456789abcdef00\nalice tml-alice-second-key-0000\n")
    with _serve(tmp_path, "--api-keys", str(tmp_path / "keys"), key=keys["bob"][0]) as (url, output):
        api = f"{url}/api/v1"
        denied = httpx.get(f"{api}/healthz", headers={"X-API-Key": "tml-skyrl-test"})
        assert denied.status_code == 401 and "--api-keys" in denied.json()["detail"]
        session = httpx.post(f"{api}/create_session", json={}, headers={"X-API-Key": keys["alice"][0]}).json()
        heartbeat = {"session_id": session["session_id"]}
        # a tenant's keys all name it; another tenant's key does not reach its session
        assert httpx.post(f"{api}/session_heartbeat", json=heartbeat,
                          headers={"X-API-Key": keys["alice"][1]}).status_code == 200
        assert httpx.post(f"{api}/session_heartbeat", json=heartbeat,
                          headers={"X-API-Key": keys["bob"][0]}).status_code == 410
    assert any("3 API keys for 2 tenants" in line for line in output), output


def test_serve_command_says_when_it_is_single_user(tmp_path):
    with _serve(tmp_path) as (url, output):
        assert httpx.get(f"{url}/api/v1/healthz").status_code == 200  # no key needed
    assert any("single-user mode" in line and "no authentication" in line for line in output), output


@pytest.mark.parametrize("content,message", [
    ("alice tml-alice-0123456789abcdef\nbob\n", "line 2: expected '<tenant> <key>', got 1 fields"),
    ("alice tml-short\n", "line 1: the key of tenant 'alice' must start with 'tml-'"),
    ("alice alice-0123456789abcdef-no-prefix\n", "line 1: the key of tenant 'alice' must start with 'tml-'"),
    ("al/ice tml-alice-0123456789abcdef\n", "line 1: tenant name 'al/ice'"),
    ("alice tml-alice-0123456789abcdef\nbob tml-alice-0123456789abcdef\n",
     "line 2: the key of tenant 'bob' is already the key of tenant 'alice' (line 1)"),
    ("# nobody\n", "has no keys"),
])
def test_a_bad_api_keys_file_is_refused_naming_the_line(tmp_path, content, message):
    (tmp_path / "keys").write_text(content)
    result = CliRunner().invoke(build_app(), ["serve", "--api-keys", str(tmp_path / "keys")])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "tml-alice-0123456789abcdef" not in result.output  # keys are never echoed


def test_api_key_and_api_keys_together_are_refused(tmp_path):
    (tmp_path / "keys").write_text("alice tml-alice-0123456789abcdef\n")
    runner = CliRunner()
    both = runner.invoke(build_app(), ["serve", "--api-key", "tml-x", "--api-keys", str(tmp_path / "keys")])
    assert both.exit_code == 1 and "not both" in both.output
    missing = runner.invoke(build_app(), ["serve", "--api-keys", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "cannot read the --api-keys file" in missing.output

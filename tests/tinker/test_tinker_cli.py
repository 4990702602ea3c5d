"""``skyrl-tinker serve`` as a user runs it: a subprocess on loopback, reached by the real client."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tinker
from skyrl_tinker.cli import build_app
from typer.testing import CliRunner

SECRET = "tml-secret-0123456789"


def write_private(path: Path, text: str) -> None:
    """A keys file as a user should keep it: readable by its owner only."""
    path.write_text(text)
    path.chmod(0o600)


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
    with _serve(tmp_path, env={"SKYRL_TINKER_API_KEY": SECRET}, key=SECRET) as (url, output):
        denied = httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": "tml-wrong"})
        assert denied.status_code == 401 and "--api-key" in denied.json()["detail"]
        service = tinker.ServiceClient(base_url=url, api_key=SECRET)
        models = service.get_server_capabilities().supported_models
        assert [m.model_name for m in models] == ["tiny-random"]
        service.close("success").result()
    assert any("one shared API key" in line for line in output), output


def test_serve_command_with_a_key_per_tenant(tmp_path):
    keys = {"alice": ["tml-alice-0123456789abcdef", "tml-alice-second-key-0000"], "bob": ["tml-bob-0123456789abcdef00"]}
    write_private(tmp_path / "keys", "# tenant key\n\nalice tml-alice-0123456789abcdef\n"
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
    ("al/ice tml-alice-0123456789abcdef\n", "line 1: the tenant name must be letters"),
    ("alice tml-alice-0123456789abcdef\nbob tml-alice-0123456789abcdef\n",
     "line 2: the key of tenant 'bob' is already the key of tenant 'alice' (line 1)"),
    ("# nobody\n", "has no keys"),
])
def test_a_bad_api_keys_file_is_refused_naming_the_line(tmp_path, content, message):
    write_private(tmp_path / "keys", content)
    result = CliRunner().invoke(build_app(), ["serve", "--api-keys", str(tmp_path / "keys")])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "tml-alice-0123456789abcdef" not in result.output  # keys are never echoed


def test_api_key_and_api_keys_together_are_refused(tmp_path):
    write_private(tmp_path / "keys", "alice tml-alice-0123456789abcdef\n")
    runner = CliRunner()
    both = runner.invoke(build_app(), ["serve", "--api-key", "tml-x", "--api-keys", str(tmp_path / "keys")])
    assert both.exit_code == 1 and "not both" in both.output
    missing = runner.invoke(build_app(), ["serve", "--api-keys", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "cannot read the --api-keys file" in missing.output


@pytest.mark.parametrize("args,env", [(["--api-key", ""], {}), ([], {"SKYRL_TINKER_API_KEY": ""}),
                                      (["--api-key", "   "], {})], ids=["empty-option", "empty-variable", "blank"])
def test_an_empty_api_key_is_an_error_not_an_open_server(args, env):
    """``--api-key "$TINKER_KEY"`` with the variable unset must not start a server that takes every request."""
    result = CliRunner().invoke(build_app(), ["serve", *args], env=env)
    assert result.exit_code == 1 and "--api-key is empty" in result.output and "unset" in result.output, result.output
    assert "serving" not in result.output


@pytest.mark.parametrize("key", ["tml-short", "no-prefix-0123456789abcdef", "tml-has a space-0123456789",
                                 "tml-\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"])
def test_a_guessable_or_unsendable_shared_key_is_refused_without_repeating_it(key):
    result = CliRunner().invoke(build_app(), ["serve", "--api-key", key])
    assert result.exit_code == 1 and "must start with 'tml-'" in result.output and key not in result.output


def test_a_keys_file_others_can_read_is_refused_naming_the_fix(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice tml-alice-0123456789abcdef\n")
    for mode in (0o644, 0o640, 0o604, 0o660, 0o602):
        keys.chmod(mode)
        result = CliRunner().invoke(build_app(), ["serve", "--api-keys", str(keys)])
        assert result.exit_code == 1 and f"chmod 600 {keys}" in result.output, (oct(mode), result.output)
        assert "tml-alice-0123456789abcdef" not in result.output


@pytest.mark.parametrize("content", ["tml-alice-0123456789abcdef alice\n", "alice tml-alice-0123456789abcdef\n"
                                     "tml-bob-0123456789abcdef00 bob\n", "tml-alice-0123456789abcdef\ttml-x\n"])
def test_swapped_columns_are_named_and_the_key_is_never_printed(tmp_path, content):
    write_private(tmp_path / "keys", content)
    result = CliRunner().invoke(build_app(), ["serve", "--api-keys", str(tmp_path / "keys")])
    assert result.exit_code == 1 and "looks like a key" in result.output, result.output
    assert "0123456789abcdef" not in result.output


def test_a_library_user_gets_the_same_key_checks():
    from skyrl_tinker.app import ServerConfig
    from skyrl_tinker.tenants import TenantConfigError

    for config in (ServerConfig(api_key=""), ServerConfig(api_keys={"": "alice"}),
                   ServerConfig(api_keys={"tml-alice-0123456789abcdef": "alice", "tml-x": "bob"})):
        with pytest.raises(TenantConfigError):
            config.tenant_keys()
    assert ServerConfig(api_key=SECRET).tenant_keys() == {SECRET: "default"}

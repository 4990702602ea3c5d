"""``skyrl-tinker serve`` as a user runs it: a subprocess on loopback, reached by the real client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import tinker


def test_serve_command_with_api_key(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "SKYRL_TINKER_API_KEY": "tml-secret", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", "from skyrl_tinker.cli import main; main()", "serve", "--port", str(port),
               "--checkpoint-dir", str(tmp_path)]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": "tml-secret"}).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"server did not start: {proc.stdout.read() if proc.poll() is not None else 'timeout'}")
            time.sleep(0.2)
        denied = httpx.get(f"{url}/api/v1/healthz", headers={"X-API-Key": "tml-wrong"})
        assert denied.status_code == 401 and "--api-key" in denied.json()["detail"]
        service = tinker.ServiceClient(base_url=url, api_key="tml-secret")
        models = service.get_server_capabilities().supported_models
        assert [m.model_name for m in models] == ["tiny-random"]
        service.close("success")
    finally:
        proc.terminate()
        proc.wait(timeout=30)

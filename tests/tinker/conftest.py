"""A skyrl-tinker server on loopback (uvicorn in a thread of the test process) and real tinker clients."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("tinker")


class LocalServer:
    """Starts the app on a free port; ``service`` is the live server object, for white-box checks."""

    def __init__(self, checkpoint_dir: Path, **config: object) -> None:
        import uvicorn
        from skyrl_tinker.app import ServerConfig, create_app

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.config = ServerConfig(base_model="tiny-random", checkpoint_dir=str(checkpoint_dir), **config)
        self.app = create_app(self.config)
        self.service = self.app.state.service
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("skyrl-tinker server did not start")
            time.sleep(0.02)

    def client(self):
        import tinker

        return tinker.ServiceClient(base_url=self.url, api_key="tml-skyrl-test")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


@pytest.fixture(autouse=True, scope="session")
def _quiet_client(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("TINKER_TELEMETRY", "0")
    mp.setenv("TINKER_API_KEY", "tml-skyrl-test")
    # the client would otherwise read ~/.tinker credentials and ignore nothing else
    mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def one_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def server(tmp_path_factory, one_thread):
    srv = LocalServer(tmp_path_factory.mktemp("tinker-ckpt"))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def service_client(server):
    client = server.client()
    yield client
    client.close("success")

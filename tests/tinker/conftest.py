"""A skyrl-tinker server on loopback (uvicorn in a thread of the test process) and real tinker clients."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("tinker") is None or importlib.util.find_spec("skyrl_tinker") is None:
    if os.environ.get("SKYRL_REQUIRE_TINKER") == "1":  # CI: scripts/setup.sh installs it, so this is a failure
        raise RuntimeError("SKYRL_REQUIRE_TINKER=1 but skyrl-tinker[test] is not installed (pip install -e './tinker[test]')")
    # skyrl-tinker[test] is not installed here: nothing in this folder can run
    collect_ignore_glob = ["test_*.py"]
else:
    from skyrl_tinker.local import LocalServer as _LocalServer

    class LocalServer(_LocalServer):
        """The in-process server on tiny-random with its checkpoints under ``checkpoint_dir``, seeded (``seed=0``)
        so what requests leave unseeded does not make a test's outcome a matter of luck."""

        def __init__(self, checkpoint_dir: Path, **config: object) -> None:
            from skyrl_tinker.app import ServerConfig

            super().__init__(ServerConfig(base_model="tiny-random", checkpoint_dir=str(checkpoint_dir),
                                          **{"seed": 0, **config}))

        def client(self, api_key: str = "tml-skyrl-test"):
            import tinker

            return tinker.ServiceClient(base_url=self.url, api_key=api_key)


@pytest.fixture(scope="session")
def new_server() -> type[LocalServer]:
    """``new_server(checkpoint_dir)`` starts a server on tiny-random; the test stops it (for restarts)."""
    return LocalServer


@pytest.fixture(autouse=True, scope="module")
def _quiet_client(tmp_path_factory):
    # per module, so HOME is back before other packages' tests run (Ray, for one, keeps its token in ~/.ray)
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
    client.close("success").result()  # waited for: a session still open when its server stops sends failing heartbeats for ever

"""Run the server inside this process (uvicorn on a thread, loopback, a free port).

For scripts, benchmarks and tests that want a server without a second terminal::

    with LocalServer(ServerConfig(base_model="tiny-random")) as server:
        service = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from skyrl_tinker.app import ServerConfig, create_app
from skyrl_tinker.service import TinkerService


class LocalServer:
    """The app on ``127.0.0.1:<free port>``; ``service`` is the live server object (for white-box checks).

    A ``service`` given is served instead of one built from ``config`` (see ``create_app``).
    """

    def __init__(self, config: ServerConfig | None = None, *, service: TinkerService | None = None,
                 start_timeout: float = 120.0) -> None:
        import uvicorn
        from skyrl_core.http_serving import uvicorn_config

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.config = config or ServerConfig()
        self.app = create_app(self.config, service)
        self.service = self.app.state.service
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn_config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                                     timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, name="tinker-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + start_timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("skyrl-tinker server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

"""The local web server: the page, its static files and the JSON API (:mod:`skyrl_viewer.api`).

Standard library only (``http.server``), one thread per request, loopback by default. Run folders are
read on each API request, so a page that polls sees a run as it grows. A failure while answering is
sent to the page as a JSON error with a message, never as a traceback page or a dropped connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from skyrl_viewer.api import NotFound, answer, to_json
from skyrl_viewer.assets import PLOTLY_NAME, STATIC_TYPES, plotly_path, static_text
from skyrl_viewer.runs import Run

log = logging.getLogger(__name__)


class ViewerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, runs: Sequence[Run], host: str = "127.0.0.1", port: int = 8765) -> None:
        super().__init__((host, port), _Handler)
        self.runs = list(runs)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> threading.Thread:
        """Serve on a daemon thread (for tests and embedding); stop with ``shutdown()``."""
        thread = threading.Thread(target=self.serve_forever, name="skyrl-viewer", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: ViewerServer

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        path = self.path.split("?", 1)[0]
        try:
            if path.startswith("/api/"):
                self._send_json(HTTPStatus.OK, answer(self.server.runs, self.path))
            elif path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, STATIC_TYPES["index.html"], static_text("index.html").encode())
            elif path == f"/static/{PLOTLY_NAME}":
                self._send(HTTPStatus.OK, "text/javascript", plotly_path().read_bytes(), cache=True)
            elif path.startswith("/static/") and path[len("/static/"):] in STATIC_TYPES:
                name = path[len("/static/"):]
                self._send(HTTPStatus.OK, STATIC_TYPES[name], static_text(name).encode())
            else:
                self._send_json(HTTPStatus.NOT_FOUND, {"error": f"nothing at {path}"})
        except NotFound as exc:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away mid-answer
        except Exception as exc:
            log.exception("skyrl view: failed to answer %s", self.path)
            self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})

    def _send_json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(status, "application/json", to_json(body).encode())

    def _send(self, status: HTTPStatus, content_type: str, body: bytes, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the http.server signature)
        log.debug("%s " + format, self.address_string(), *args)

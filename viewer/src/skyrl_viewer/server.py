"""The local web server: the page, its static files and the JSON API (:mod:`skyrl_viewer.api`).

Standard library only (``http.server``), one thread per request, loopback by default. Run folders are
read on each API request, so a page that polls sees a run as it grows. A failure while answering is
sent to the page as a JSON error with a message, never as a traceback page or a dropped connection.
Only GET and HEAD are answered; any other method gets a JSON 405 with ``Allow: GET, HEAD`` (one the
server does not know, a JSON 501). Every request passes core's HTTP hygiene first
(:mod:`skyrl_core.http_hygiene`): a ``Host`` that is not a loopback name, the bound address or one
of ``allowed_hosts`` gets 421, so a web page that rebinds its own name to this machine cannot read
the runs through its visitor's browser. Errors are ``{"detail": message}``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from skyrl_core.http_hygiene import HttpLimits, HttpProblem, check_request, error_body

from skyrl_viewer.api import DEFAULT_MAX_SAMPLE_CHARS, NotFound, answer, to_json
from skyrl_viewer.assets import PLOTLY_NAME, STATIC_TYPES, plotly_path, static_text
from skyrl_viewer.runs import Run

log = logging.getLogger(__name__)


class ViewerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, runs: Sequence[Run], host: str = "127.0.0.1", port: int = 8765,
                 max_sample_chars: int = DEFAULT_MAX_SAMPLE_CHARS, allowed_hosts: Sequence[str] = ()) -> None:
        super().__init__((host, port), _Handler)
        self.runs = list(runs)
        self.max_sample_chars = max_sample_chars
        self.limits = HttpLimits(max_body_bytes=0, allowed_hosts=tuple(allowed_hosts))  # GET and HEAD carry no body
        self.bound_host = host

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
    # Seconds a connection may stay silent (its request half-sent, or an answer unread) before it is closed:
    # otherwise each half-open connection holds a thread for ever, and a script that opens thousands stalls
    # the viewer for everyone.
    timeout = 30.0

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        path = self.path.split("?", 1)[0]
        try:
            check_request(self.command, {name.lower(): value for name, value in self.headers.items()},
                          self.server.limits, self.server.bound_host)
            if path.startswith("/api/"):
                self._send_json(HTTPStatus.OK, answer(self.server.runs, self.path, self.server.max_sample_chars))
            elif path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, STATIC_TYPES["index.html"], static_text("index.html").encode())
            elif path == f"/static/{PLOTLY_NAME}":
                self._send(HTTPStatus.OK, "text/javascript", plotly_path().read_bytes(), cache=True)
            elif path.startswith("/static/") and path[len("/static/"):] in STATIC_TYPES:
                name = path[len("/static/"):]
                self._send(HTTPStatus.OK, STATIC_TYPES[name], static_text(name).encode())
            else:
                self._send_error(HTTPStatus.NOT_FOUND, "nothing at this path")
        except HttpProblem as problem:
            self._send_error(HTTPStatus(problem.status), problem.message)
        except NotFound as exc:
            self._send_error(HTTPStatus.NOT_FOUND, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away mid-answer
        except Exception as exc:
            log.exception("skyrl view: failed to answer %s", self.path)
            self._send_error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    do_HEAD = do_GET  # the same answer; _send leaves out the body

    def _refuse_method(self) -> None:
        self.send_error(HTTPStatus.METHOD_NOT_ALLOWED)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = _refuse_method

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error http.server sends itself (an unknown method, a malformed request line) as JSON too.

        Its own message is left out (it may repeat the request line); the request may not have been read
        to its end, so the connection closes after the answer.
        """
        status = HTTPStatus(code)
        headers = {"Connection": "close"}
        error = status.phrase
        if status in (HTTPStatus.METHOD_NOT_ALLOWED, HTTPStatus.NOT_IMPLEMENTED):
            headers["Allow"] = "GET, HEAD"
            error += ": this server only answers GET and HEAD"
        self.close_connection = True
        self._send_error(status, error, headers)

    def _send_error(self, status: HTTPStatus, message: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, "application/json", error_body(message), headers=headers)

    def _send_json(self, status: HTTPStatus, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._send(status, "application/json", to_json(body).encode(), headers=headers)

    def _send(self, status: HTTPStatus, content_type: str, body: bytes, cache: bool = False,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", f"{content_type}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=86400" if cache else "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the http.server signature)
        log.debug("%s " + format, self.address_string(), *args)

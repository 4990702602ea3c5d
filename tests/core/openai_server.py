"""A real OpenAI-compatible HTTP server on loopback for the ``openai`` engine tests.

It answers ``/v1/models``, ``/v1/completions`` (prompt as token ids, sampled tokens reported as
``"token_id:N"`` like vLLM's ``return_tokens_as_token_ids``, or as text like servers without that
extension) and ``/v1/chat/completions``. Every request is recorded. Faults queued with
:meth:`OpenAIServer.inject` replace the next answers: an error status with a body and headers, a
delay (to trigger client timeouts) or a raw, malformed body.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Completion:
    """What the "model" samples: ids (the end-of-turn id included when it stopped) and logprobs."""

    token_ids: list[int]
    finish_reason: str | None = "stop"
    logprobs: list[float] | None = None

    def token_logprobs(self) -> list[float]:
        # Exact binary fractions, so equality after the JSON round trip is meaningful.
        return self.logprobs if self.logprobs is not None else [-(i % 7 + 1) / 8 for i in range(len(self.token_ids))]


@dataclass
class Fault:
    """Replaces the answer to one request: wait ``delay_s``, then send ``status``/``body`` (``body=None``
    with status 200 answers normally after the delay)."""

    status: int = 200
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def error_fault(status: int, message: str, headers: dict[str, str] | None = None) -> Fault:
    """An OpenAI-style JSON error answer."""
    body = json.dumps({"error": {"message": message, "type": "ServerError", "code": status}}).encode()
    return Fault(status, body, headers or {})


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float
    sent: Completion | None = None  # what /v1/completions answered, after max_tokens


Responder = Callable[[list[int]], Completion]


class OpenAIServer:
    """Start with ``with OpenAIServer(tokenizer) as server:``; ``server.url`` is the ``/v1`` root."""

    def __init__(self, tokenizer: Any, *, models: Sequence[str] = ("tiny-chatml",), token_ids: bool = True,
                 ignore_max_tokens: bool = False, responder: Responder | None = None, latency_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.models = list(models)
        self.token_ids = token_ids
        self.ignore_max_tokens = ignore_max_tokens
        self.responder = responder
        self.latency_s = latency_s
        self.completions: deque[Completion] = deque()
        self.chat_replies: deque[str] = deque()
        self.faults: deque[Fault] = deque()
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> OpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def inject(self, *faults: Fault) -> None:
        self.faults.extend(faults)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == path]

    @property
    def sent(self) -> list[Completion]:
        """Completions answered so far, in request order."""
        return [r.sent for r in self.requests if r.sent is not None]

    def handle(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, bytes, dict[str, str]]:
        """Status, body and headers for one request (runs on the server's handler threads)."""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        record = RecordedRequest(method, path, headers, body, time.monotonic())
        with self._lock:
            self.requests.append(record)
            fault = self.faults.popleft() if self.faults else None
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if fault is not None:
                time.sleep(fault.delay_s)
                if fault.body is not None or fault.status != 200:
                    return fault.status, fault.body or b"", fault.headers
            return self._answer(record)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer(self, record: RecordedRequest) -> tuple[int, bytes, dict[str, str]]:
        method, path, body = record.method, record.path, record.body
        if method == "GET" and path == "/v1/models":
            return _json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            return _json(404, {"error": {"message": f"no route {method} {path}"}})
        if not isinstance(body, dict) or body.get("model") not in self.models:
            model = body.get("model") if isinstance(body, dict) else None
            return _json(404, {"error": {"message": f"The model `{model}` does not exist."}})
        time.sleep(self.latency_s)
        if path == "/v1/chat/completions":
            return _json(200, self._chat(body))
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(i, int) for i in prompt):
            return _json(400, {"error": {"message": "prompt must be a list of token ids"}})
        return self._completion(record, prompt)

    def _completion(self, record: RecordedRequest, prompt: list[int]) -> tuple[int, bytes, dict[str, str]]:
        body = record.body
        with self._lock:
            queued = self.completions.popleft() if self.completions else None
        completion = queued or (self.responder(prompt) if self.responder else None)
        if completion is None:
            return _json(500, {"error": {"message": "test server has no completion queued and no responder"}})
        ids, logprobs, finish = completion.token_ids, completion.token_logprobs(), completion.finish_reason
        if not self.ignore_max_tokens and len(ids) > body["max_tokens"]:
            ids, logprobs, finish = ids[: body["max_tokens"]], logprobs[: body["max_tokens"]], "length"
        record.sent = Completion(ids, finish, logprobs)
        choice: dict[str, Any] = {"index": 0, "text": self.tokenizer.decode(ids, skip_special_tokens=True),
                                  "logprobs": None, "finish_reason": finish}
        if body.get("logprobs") is not None:
            as_ids = self.token_ids and body.get("return_tokens_as_token_ids")
            tokens = [f"token_id:{i}" if as_ids else self.tokenizer.decode([i]) for i in ids]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": logprobs,
                                  "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)]}
        return _json(200, {"id": f"cmpl-{len(self.requests)}", "object": "text_completion", "model": body["model"],
                           "choices": [choice], "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}})

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            reply = self.chat_replies.popleft() if self.chat_replies else None
        if reply is None:
            reply = "echo: " + str(body["messages"][-1]["content"])
        return {"id": "chatcmpl-1", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}]}


def _json(status: int, payload: Any) -> tuple[int, bytes, dict[str, str]]:
    return status, json.dumps(payload).encode(), {"Content-Type": "application/json"}


def _handler_for(app: OpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _serve(self, method: str) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body, extra = app.handle(method, self.path, headers, raw)
            try:
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout tests)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

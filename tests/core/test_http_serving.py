"""Connections a stranger opens and never finishes: closed, on a real uvicorn server on loopback.

The deadline is set to 1 s here (30 s by default); every wait below is for the server to act, with a
generous bound, never a measure of how fast it does.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="the servers that use skyrl_core.http_serving depend on uvicorn")
from skyrl_core.http_hygiene import HttpLimits, HygieneMiddleware  # noqa: E402
from skyrl_core.http_serving import HeadDeadlineProtocol, uvicorn_config  # noqa: E402


async def app(scope, receive, send):
    """Answers ``/slow`` after 3 s (longer than the deadline), anything else at once, with the body's length."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":
        await asyncio.sleep(3)
    answer = str(len(body)).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    patch = pytest.MonkeyPatch()
    patch.setattr(HeadDeadlineProtocol, "head_timeout_s", 1.0)
    limits = HttpLimits(body_idle_s=1.0, body_types=frozenset({"text/plain"}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(HygieneMiddleware(app, limits), host="127.0.0.1", port=free,
                                           log_level="warning", timeout_keep_alive=60))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield free
    server.should_exit = True
    thread.join(30)
    patch.undo()


def closed_by_server(sock: socket.socket, within: float = 30.0) -> bytes:
    """Everything the server sends until it closes the connection (fails if it has not within ``within`` s)."""
    sock.settimeout(within)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def request(sock: socket.socket, path: str = "/", body: bytes = b"") -> bytes:
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                 % (path.encode(), len(body), body))
    sock.settimeout(30)
    reply = b""
    while True:  # the head and the body may come in separate segments
        chunk = sock.recv(4096)
        assert chunk, f"the server closed the connection after {reply!r}"
        reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), None)
        if length is not None and len(body) >= length:
            assert reply.startswith(b"HTTP/1.1 200"), reply
            return body


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1\r\nHost: localhost\r\nX-A: 1\r\n"],
                         ids=["nothing", "request-line", "half-the-headers"])
def test_a_connection_that_never_finishes_its_request_head_is_closed(port, sent):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(sent)
        assert closed_by_server(sock) == b""  # closed without an answer, instead of held for ever


def test_a_connection_idle_after_its_answer_is_closed_too(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert request(sock, body=b"abc") == b"3"
        sock.sendall(b"GET / HT")  # the next request's head, never finished
        assert closed_by_server(sock) == b""


def test_a_body_that_stops_arriving_is_408(port):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nab")
        answer = closed_by_server(sock)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive in time" in answer


def test_honest_clients_are_not_cut_off(port):
    """A request that takes longer than the deadline to answer, and keep-alive requests that follow it,
    are served: the deadline runs only while the server waits for a request head."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert request(sock, "/slow", b"x" * 10) == b"10"
        for size in (0, 5, 70_000):
            assert request(sock, body=b"y" * size) == str(size).encode()

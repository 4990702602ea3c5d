"""One hygiene layer for every HTTP server we ship: other people's code and web pages reach them.

A server started on a shared machine answers anything that can open a socket to it: another user's
script, and a web page in someone's browser (through DNS rebinding, a page on another origin can
make the browser send requests whose ``Host`` is its own name). So every request is checked before
a handler or a parser sees it, with the same rules and the same errors everywhere:

- ``Host`` must name this server: loopback names, the address it listens on, and the names given
  with ``--allowed-host`` (421 otherwise: a rebinding page's requests carry its own name).
- A body may be at most ``max_body_bytes``, checked on ``Content-Length`` and again on the bytes as
  they arrive, before anything parses them (413).
- A state-changing request (``POST``, ``PUT``, ``PATCH``, ``DELETE``) from a web page of another
  origin is refused (403): one whose ``Origin`` is not the ``Host`` it was sent to (or is ``null``),
  or whose ``Sec-Fetch-Site`` says ``cross-site`` or ``same-site``. Our servers' APIs are for
  programs, which send neither header; a page's ``fetch`` or form sends both.
- A ``POST`` must say what its body is in a content type the server takes, even with no body, and a
  ``PUT``, ``PATCH`` or ``DELETE`` with a body must too (415): a cross-site form, ``text/plain`` or
  empty POST, which a browser sends without asking, is refused instead of acted on.
- A ``Content-Encoding`` other than identity must be one the server decodes itself
  (``body_encodings``; 415 otherwise), so no body reaches a parser under a label that skipped a check.
- A JSON body may nest ``max_json_depth`` deep and hold ``max_json_items`` values at most, counted
  in one pass over its bytes with constant memory, and may not hold a lone surrogate (400): decoding
  it cannot cost much more than its size, and nothing downstream meets text it cannot encode.
  Every JSON body a server parses goes through :func:`parse_json` (or :func:`load_json`, off the
  event loop for large bodies), whatever its label or encoding said, so the checks cannot be skipped.
- Errors are ``{"detail": message}`` with a 4xx status (a FastAPI server's 422 keeps its list of
  :func:`validation_errors`); a message never repeats the input (a 10 MB bad value must not come
  back as a 10 MB error), only where it is and what is wrong: values a message names go through
  :func:`shown`, and :func:`error_body` cuts any message to ``MAX_MESSAGE_CHARS``.

:class:`HygieneMiddleware` applies this to any ASGI app (FastAPI included) with no dependency;
servers on :mod:`http.server` call :func:`check_request` and :func:`check_body` themselves.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPES = frozenset({"application/json"})
# The bytes that matter for a JSON text's structure; everything between them is skipped by the regex engine.
_SPECIAL = re.compile(rb'["\\\[\]{},]')
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPENING, _CLOSING = frozenset(b"[{"), frozenset(b"]}")
OFF_LOOP_BYTES = 256 * 1024  # a body this large is checked and parsed in a thread, not on the event loop
MAX_MESSAGE_CHARS = 1000  # the longest error message a server sends
_CROSS_SITE = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site values of another origin's page
_LONE_SURROGATE = "the JSON body holds a lone surrogate (an escape in \\ud800-\\udfff without its pair)"


@dataclass(frozen=True)
class HttpLimits:
    """What one server accepts; every field has a default safe for a JSON API."""

    max_body_bytes: int = 1 << 20
    max_json_depth: int = 32
    max_json_items: int = 100_000
    allowed_hosts: tuple[str, ...] = ()  # names beyond the loopback ones and the bound address
    body_types: frozenset[str] = JSON_TYPES  # content types a state-changing request may carry
    body_encodings: frozenset[str] = frozenset()  # Content-Encodings the server decodes itself (beyond identity)
    body_idle_s: float = 30.0  # the longest a client may pause while sending a body (408 after)
    body_total_s: float = 600.0  # the longest a body may take to arrive (408 after): 64 MB at about 110 kB/s

    def host_names(self, bound_host: str | None = None) -> frozenset[str]:
        names = {*LOOPBACK_HOSTS, *(name.lower() for name in self.allowed_hosts)}
        if bound_host and bound_host not in ("0.0.0.0", "::"):
            names.add(bound_host.lower().strip("[]"))
        return frozenset(names)


@dataclass
class HttpProblem(Exception):
    """A request this server refuses: its status and a message that does not repeat the input."""

    status: int
    message: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def error_body(message: str) -> bytes:
    """The JSON body of every error: ``{"detail": message}``, ASCII-only (no text it cannot encode), the
    message cut to ``MAX_MESSAGE_CHARS``."""
    return json.dumps({"detail": capped(message)}).encode("ascii")


def capped(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE_CHARS`` (the last resort of the echo rule: callers quote with :func:`shown`)."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS - 3] + "..."


def shown(value: Any, limit: int = 80) -> str:
    """How an error message quotes a value from the request: its ``repr``, cut to ``limit`` characters, so a
    10 kB id or name never comes back whole."""
    quoted = repr(value)
    return quoted if len(quoted) <= limit else quoted[:limit - 3] + "..."


def host_of(header: str) -> str:
    """The host name of a ``Host`` header, without its port (``[::1]:80`` -> ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def check_request(method: str, headers: Mapping[str, str], limits: HttpLimits, bound_host: str | None = None
                  ) -> None:
    """Check what the request line and headers say (``headers`` with lower-case names); raises HttpProblem."""
    host = headers.get("host")
    if not host or host_of(host) not in limits.host_names(bound_host):
        raise HttpProblem(421, "this server does not answer for that Host; start it with --allowed-host NAME to "
                               "add a name it may be reached by")
    method = method.upper()
    if method in STATE_CHANGING:
        check_same_origin(headers)
    length = headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise HttpProblem(400, "Content-Length is not a number")
        if int(length) > limits.max_body_bytes:
            raise HttpProblem(413, f"the body is larger than this server's limit of {limits.max_body_bytes:,} bytes")
    has_body = (length is not None and int(length) > 0) or "transfer-encoding" in headers
    if method == "POST" or (method in STATE_CHANGING and has_body):
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if content_type not in limits.body_types:
            raise HttpProblem(415, f"a {method} must carry a Content-Type of: {', '.join(sorted(limits.body_types))}"
                                   " (a body-less POST too: a browser sends those cross-site without asking)")
    encoding = headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity") and encoding not in limits.body_encodings:
        accepted = ", ".join(["identity", *sorted(limits.body_encodings)])
        raise HttpProblem(415, f"this server does not decode the body's Content-Encoding; it accepts: {accepted}")


def check_same_origin(headers: Mapping[str, str]) -> None:
    """Refuse (403) a request a web page of another origin sent: an ``Origin`` other than the ``Host``
    the request went to (``null`` included), or ``Sec-Fetch-Site: cross-site`` / ``same-site``."""
    origin = headers.get("origin")
    foreign = origin is not None and _authority(origin) != headers.get("host", "").strip().lower()
    if foreign or headers.get("sec-fetch-site", "").strip().lower() in _CROSS_SITE:
        raise HttpProblem(403, "a web page of another origin may not change state on this server (its Origin or "
                               "Sec-Fetch-Site says so); call the API from a program, not from a browser page")


def _authority(origin: str) -> str | None:
    """``host[:port]`` of an ``Origin`` (``http://localhost:8000`` -> ``localhost:8000``); None for ``null``."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return rest.rstrip("/") if sep and scheme in ("http", "https") else None


def check_body(body: bytes, content_type: str, limits: HttpLimits, content_encoding: str = "") -> None:
    """Check a whole body before anything parses it: its size and, for JSON, its structure; raises HttpProblem.

    A compressed body (a ``Content-Encoding`` other than identity) is checked for its size only: the app
    parses what it decompresses with :func:`parse_json`, which checks it then.
    """
    if len(body) > limits.max_body_bytes:
        raise HttpProblem(413, f"the body is larger than this server's limit of {limits.max_body_bytes:,} bytes")
    compressed = content_encoding.strip().lower() not in ("", "identity")
    if not compressed and content_type.split(";", 1)[0].strip().lower() in JSON_TYPES:
        check_json_structure(body, limits)


def check_json_structure(data: bytes, limits: HttpLimits) -> None:
    """Refuse JSON nested or populated beyond ``limits``, or holding a lone surrogate, in one pass.

    Walks the bytes that matter (quotes, backslashes, brackets, commas) once, left to right, with
    constant memory, and stops at the first limit passed; each value but the first of a container
    follows a comma, so brackets and commas count the values. What is not JSON at all (an unclosed
    string, say) is left for the parser to refuse.
    """
    depth = items = 0
    in_string = False
    skip_to = 0  # the character after a backslash is part of its escape
    high_ends_at = -1  # inside a string: where an unpaired high surrogate's escape ends
    for match in _SPECIAL.finditer(data):
        at = match.start()
        if at < skip_to:
            continue
        char = data[at]
        if in_string:
            if char == _BACKSLASH:
                skip_to = at + 2
                code = int(data[at + 2:at + 6], 16) if data[at + 1:at + 2] == b"u" and _HEX4.fullmatch(
                    data, at + 2, at + 6) else -1
                high_ends_at = _after_escape(code, at, at + 6, high_ends_at)
            elif char == _QUOTE:
                in_string = False
                if high_ends_at >= 0:
                    raise HttpProblem(400, _LONE_SURROGATE)
            continue
        if char == _QUOTE:
            in_string, high_ends_at = True, -1
        elif char in _OPENING:
            depth += 1
            items += 1
            if depth > limits.max_json_depth:
                raise HttpProblem(400, f"the JSON body nests deeper than {limits.max_json_depth} levels")
        elif char in _CLOSING:
            depth -= 1
        else:
            items += 1
        if items > limits.max_json_items:
            raise HttpProblem(400, f"the JSON body holds more than {limits.max_json_items:,} values")


def parse_json(data: bytes, limits: HttpLimits) -> Any:
    """``data`` parsed as JSON after :func:`check_json_structure`: the one way a server turns a body into
    values, whatever the body's label or encoding said. A body that is not JSON is a 400 that says where.

    Only UTF-8 is read (JSON over HTTP is UTF-8): ``json.loads`` would take UTF-16 or UTF-32 bytes too,
    whose escapes and quotes the byte scan cannot follow, so a lone surrogate or deep nesting could
    hide in them."""
    check_json_structure(data, limits)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise HttpProblem(400, "the body is not UTF-8 JSON") from None
    except json.JSONDecodeError as exc:  # its message gives the position, never the text
        raise HttpProblem(400, f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError:  # Python reads no integer of more than 4,300 digits
        raise HttpProblem(400, "the body is not JSON this server reads: a number has more than 4,300 digits") from None
    except RecursionError:  # unreachable within max_json_depth; kept so no limit can turn it into a 500
        raise HttpProblem(400, "the JSON body nests too deep") from None


async def load_json(data: bytes, limits: HttpLimits) -> Any:
    """:func:`parse_json` for an async server: a body of ``OFF_LOOP_BYTES`` or more is checked and parsed
    in a thread, so one large request does not hold up every other request on the event loop."""
    if len(data) >= OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_json, data, limits)
    return parse_json(data, limits)


def _after_escape(code: int, start: int, end: int, high_ends_at: int) -> int:
    """Where an unpaired high surrogate now ends (-1: none), after the escape at ``start`` (``code``: its
    ``\\uXXXX`` value, or -1 for another escape); a surrogate without its pair raises."""
    paired = high_ends_at == start
    if high_ends_at >= 0 and not (paired and 0xDC00 <= code <= 0xDFFF):
        raise HttpProblem(400, _LONE_SURROGATE)
    if 0xDC00 <= code <= 0xDFFF and not paired:
        raise HttpProblem(400, _LONE_SURROGATE)
    return end if 0xD800 <= code <= 0xDBFF else -1


def validation_errors(errors: Iterable[Mapping[str, Any]], most: int = 10) -> list[dict[str, Any]]:
    """Pydantic-style errors as where and what (``type``, ``loc``, ``msg``), never the input's value: the first
    ``most``, each name and message cut to 200 characters and made encodable (a lone surrogate becomes its escape)."""
    return [{"type": _quoted(error.get("type", "invalid")), "loc": [_quoted(part) for part in error.get("loc", ())],
             "msg": _quoted(error.get("msg", "invalid"))} for error in list(errors)[:most]]


def validation_detail(errors: Iterable[Mapping[str, Any]]) -> str:
    """:func:`validation_errors` in one line: ``invalid request: body.topk: msg; ...``."""
    parts = [".".join(str(part) for part in error["loc"]) + f": {error['msg']}" for error in validation_errors(errors)]
    return "invalid request: " + "; ".join(parts)


def _quoted(part: Any) -> Any:
    if not isinstance(part, str):
        return part
    return part[:200].encode("utf-8", "backslashreplace").decode("utf-8")


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class HygieneMiddleware:
    """An ASGI middleware that checks every HTTP request by ``limits`` before ``app`` sees it.

    The body is read here (up to the limit, counted as it arrives), checked, and handed on whole,
    so the app parses only what passed. ``bound_host`` is the address the server listens on.
    """

    def __init__(self, app: ASGIApp, limits: HttpLimits, bound_host: str | None = None) -> None:
        self.app = app
        self.limits = limits
        self.bound_host = bound_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            check_request(scope["method"], headers, self.limits, self.bound_host)
            body = await _read_body(receive, self.limits)
            args = (body, headers.get("content-type", ""), self.limits, headers.get("content-encoding", ""))
            if len(body) >= OFF_LOOP_BYTES:  # a long scan must not hold up the other requests on the loop
                await asyncio.to_thread(check_body, *args)
            else:
                check_body(*args)
        except HttpProblem as problem:
            await send_problem(send, problem)
            return
        await self.app(scope, _replay(body, receive), send)


async def _read_body(receive: Receive, limits: HttpLimits) -> bytes:
    """The whole body, refused (413) past ``max_body_bytes`` and (408) when the client pauses longer than
    ``body_idle_s`` or takes longer than ``body_total_s`` in all: a body sent a byte at a time must not hold
    a connection, and its server's file descriptors, for ever."""
    chunks, size, limit = [], 0, limits.max_body_bytes
    deadline = asyncio.get_running_loop().time() + limits.body_total_s
    while True:
        wait = min(limits.body_idle_s, deadline - asyncio.get_running_loop().time())
        try:
            message = await asyncio.wait_for(receive(), max(wait, 0.0))
        except asyncio.TimeoutError:  # the builtin TimeoutError only from Python 3.11
            raise HttpProblem(408, f"the body did not arrive in time (a pause of {limits.body_idle_s:g} s, or "
                                   f"{limits.body_total_s:g} s in all)", {"connection": "close"}) from None
        if message["type"] == "http.disconnect":
            raise HttpProblem(400, "the client went away before sending its body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HttpProblem(413, f"the body is larger than this server's limit of {limit:,} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the checked body once, then what the connection says next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def send_problem(send: Send, problem: HttpProblem) -> None:
    """Answer an ASGI request with ``problem`` as JSON."""
    body = error_body(problem.message)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in problem.headers.items()]
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

"""The HTTP hygiene layer every server uses: Host allow-list, body limits, JSON limits, content types, errors.

Checked here once, through its functions and through the ASGI middleware driven with the protocol's
own messages (the servers' tests then check their wiring over real HTTP).
"""

from __future__ import annotations

import json
import tracemalloc

import pytest
from skyrl_core.http_hygiene import (
    MAX_MESSAGE_CHARS,
    HttpLimits,
    HttpProblem,
    HygieneMiddleware,
    check_body,
    check_json_structure,
    check_request,
    error_body,
    host_of,
    load_json,
    parse_json,
    shown,
    validation_detail,
    validation_errors,
)

LIMITS = HttpLimits(max_body_bytes=1000, max_json_depth=4, max_json_items=50)


def refused(call, *args) -> HttpProblem:
    with pytest.raises(HttpProblem) as caught:
        call(*args)
    return caught.value


# --- Host ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["localhost", "localhost:8765", "127.0.0.1:80", "[::1]:8000", "[::1]", "LOCALHOST"])
def test_loopback_names_are_answered_with_or_without_a_port(host: str):
    check_request("GET", {"host": host}, LIMITS)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1.evil.example", "localhost.evil",
                                  "10.0.0.5:8765", "", "[::2]:80"])
def test_other_hosts_get_421_as_a_rebinding_page_would(host: str):
    problem = refused(check_request, "GET", {"host": host}, LIMITS)
    assert problem.status == 421 and "--allowed-host" in problem.message


def test_a_request_without_a_host_is_refused():
    assert refused(check_request, "GET", {}, LIMITS).status == 421


def test_allowed_hosts_and_the_bound_address_are_added_but_a_wildcard_bind_adds_nothing():
    limits = HttpLimits(allowed_hosts=("GPU-Box.lab",))
    check_request("GET", {"host": "gpu-box.lab:8000"}, limits)
    check_request("GET", {"host": "192.168.7.2:8000"}, limits, bound_host="192.168.7.2")
    assert refused(check_request, "GET", {"host": "0.0.0.0:8000"}, limits, "0.0.0.0").status == 421


def test_host_of_strips_ports_and_brackets():
    assert [host_of(h) for h in ("a.b:1", "[::1]:2", "::1", "A.B")] == ["a.b", "::1", "::1", "a.b"]


# --- bodies and content types --------------------------------------------------------------------------------------


def test_a_declared_length_above_the_limit_is_413_before_any_byte_is_read():
    problem = refused(check_request, "POST", {"host": "localhost", "content-length": "1001",
                                              "content-type": "application/json"}, LIMITS)
    assert problem.status == 413 and "1,000 bytes" in problem.message


@pytest.mark.parametrize("length", ["-1", "ten", "1e3", ""])
def test_a_malformed_content_length_is_400(length: str):
    assert refused(check_request, "POST", {"host": "localhost", "content-length": length}, LIMITS).status == 400


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; "
                                          "boundary=x", ""])
def test_a_state_changing_body_a_browser_sends_cross_site_is_415(content_type: str):
    headers = {"host": "localhost", "content-length": "2", "content-type": content_type}
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert refused(check_request, method, headers, LIMITS).status == 415


def test_json_bodies_and_bodiless_requests_pass():
    check_request("POST", {"host": "localhost", "content-length": "2", "content-type": "application/json; charset=utf-8"},
                  LIMITS)
    check_request("POST", {"host": "localhost", "content-length": "0", "content-type": "application/json"}, LIMITS)
    check_request("DELETE", {"host": "localhost"}, LIMITS)  # no browser sends a cross-site DELETE without asking
    check_request("GET", {"host": "localhost", "content-type": "text/plain"}, LIMITS)
    check_request("POST", {"host": "localhost", "content-length": "5", "content-type": "application/x-protobuf"},
                  HttpLimits(body_types=frozenset({"application/json", "application/x-protobuf"})))


@pytest.mark.parametrize("headers", [{}, {"content-length": "0"}, {"content-type": "text/plain;charset=UTF-8"},
                                     {"content-length": "0", "content-type": "application/x-www-form-urlencoded"}],
                         ids=["no-body-no-type", "empty-body", "fetch-no-cors", "empty-form"])
def test_a_post_without_a_json_type_is_415_even_without_a_body(headers: dict[str, str]):
    """``fetch(url, {method: "POST", mode: "no-cors"})`` and an empty ``<form method=post>`` send exactly these."""
    problem = refused(check_request, "POST", {"host": "localhost", **headers}, LIMITS)
    assert problem.status == 415 and "application/json" in problem.message


# --- web pages of another origin -------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {"origin": "http://evil.example"}, {"origin": "null"}, {"origin": "http://localhost:3000"},
    {"origin": "file://"}, {"origin": "http://localhost:8000.evil.example"},
    {"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"}, {"sec-fetch-site": "Cross-Site"},
    {"origin": "http://localhost:8000", "sec-fetch-site": "cross-site"},
], ids=lambda headers: ",".join(headers.values()))
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_web_page_of_another_origin_may_not_change_state(method: str, headers: dict[str, str]):
    request = {"host": "localhost:8000", "content-type": "application/json", "content-length": "2", **headers}
    problem = refused(check_request, method, request, LIMITS)
    assert problem.status == 403 and "another origin" in problem.message
    assert "evil" not in problem.message  # the origin is not repeated


@pytest.mark.parametrize("headers", [{}, {"origin": "http://localhost:8000"}, {"origin": "HTTP://LOCALHOST:8000/"},
                                     {"sec-fetch-site": "same-origin"}, {"sec-fetch-site": "none"}])
def test_programs_and_the_servers_own_pages_pass(headers: dict[str, str]):
    check_request("POST", {"host": "localhost:8000", "content-type": "application/json", **headers}, LIMITS)


def test_reading_is_not_refused_for_its_origin():
    """A cross-origin GET cannot change state, and the page cannot read the answer (no CORS headers)."""
    check_request("GET", {"host": "localhost", "origin": "http://evil.example", "sec-fetch-site": "cross-site"}, LIMITS)


# --- encodings -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "br", "deflate", "x-anything", "gzip, zstd"])
def test_a_body_in_an_encoding_the_server_does_not_decode_is_415(encoding: str):
    headers = {"host": "localhost", "content-type": "application/json", "content-length": "2",
               "content-encoding": encoding}
    problem = refused(check_request, "POST", headers, LIMITS)
    assert problem.status == 415 and "accepts: identity" in problem.message


def test_a_server_lists_the_encodings_it_decodes():
    limits = HttpLimits(body_encodings=frozenset({"zstd"}))
    headers = {"host": "localhost", "content-type": "application/json", "content-length": "2"}
    for encoding in ("zstd", "ZSTD", "identity", ""):
        check_request("POST", {**headers, "content-encoding": encoding}, limits)
    assert refused(check_request, "POST", {**headers, "content-encoding": "gzip"}, limits).status == 415


def test_check_body_counts_the_bytes_themselves():
    assert refused(check_body, b"x" * 1001, "application/octet-stream", LIMITS).status == 413
    check_body(b"x" * 1000, "application/octet-stream", LIMITS)


# --- JSON structure --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "what"), [
    (b"[[[[[1]]]]]", "deeper than 4"),
    (b'{"a": {"b": {"c": {"d": {}}}}}', "deeper than 4"),
    (b"[" + b",".join([b"0"] * 51) + b"]", "more than 50"),
    (b"[" + b",".join([b"{}"] * 30) + b"]", "more than 50"),
])
def test_json_nested_or_populated_beyond_the_limits_is_400(body: bytes, what: str):
    problem = refused(check_json_structure, body, LIMITS)
    assert problem.status == 400 and what in problem.message


@pytest.mark.parametrize("body", [
    b'["[[[[[[[[", "{{{{{{", ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,,"]',
    b'["a \\" [[[[[[ still a string", 1]',
    b'["ends with a backslash \\\\", [[1]]]',
    b'{"smile": "\\ud83d\\ude00", "escaped": "\\\\ud800"}',
    b"[[[[1]]]]",
])
def test_brackets_in_strings_escapes_and_surrogate_pairs_pass(body: bytes):
    check_json_structure(body, LIMITS)
    json.loads(body)


@pytest.mark.parametrize("body", [b'"\\ud800"', b'"\\udc00"', b'["\\ud800x\\udc00"]', b'"\\ud83d\\n"',
                                  b'{"k\\udfff": 1}', b'"\\ud800\\ud800\\udc00"'])
def test_a_lone_surrogate_is_400(body: bytes):
    assert "lone surrogate" in refused(check_json_structure, body, LIMITS).message


def test_the_check_stops_at_the_first_limit_with_constant_memory():
    many = HttpLimits(max_json_items=10**9)
    body = b"[" + b'"",' * 500_000 + b'""]'  # 1.5 MB: a million tiny values would cost the parser ~40 MB
    tracemalloc.start()
    try:
        check_json_structure(body, many)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, f"the check held {peak:,} bytes for a {len(body):,}-byte body"
    assert "more than 100,000" in refused(check_json_structure, body, HttpLimits()).message


def test_an_unclosed_string_of_escapes_is_scanned_once_not_again_from_every_quote():
    body = b'"' + b'\\"' * 400_000  # quadratic for a scanner that retries a failed string at every quote
    check_json_structure(body, LIMITS)  # not JSON: left for the parser, which refuses it


def test_parse_json_checks_whatever_the_label_said_before_parsing():
    """The one way a server turns a body into values: 100,000-deep nesting is a 400, not a RecursionError."""
    deep = b"[" * 100_000 + b"]" * 100_000
    assert "deeper than 32" in refused(parse_json, deep, HttpLimits()).message
    assert "lone surrogate" in refused(parse_json, b'{"a": "\\ud800"}', HttpLimits()).message
    assert parse_json(b'{"a": [1, "\\ud83d\\ude00"]}', HttpLimits()) == {"a": [1, "\U0001F600"]}


@pytest.mark.parametrize("body", [b"{nope", b'{"a": "' + b"x" * 100_000, b"\xff\xfe{}", b"", b"[1, 2,]",
                                  b'{"n": ' + b"9" * 5000 + b"}"])
def test_a_body_that_is_not_json_is_a_400_that_does_not_repeat_it(body: bytes):
    problem = refused(parse_json, body, HttpLimits(max_body_bytes=1 << 20))
    assert problem.status == 400 and "not" in problem.message and len(problem.message) < 200


@pytest.mark.parametrize("text", ['["\\"", ' + "[" * 50 + "]" * 50 + "]", '{"a": "\\ud800"}', '{"ok": 1}'])
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_only_utf8_is_read_so_no_check_can_be_hidden_in_another_encoding(text: str, encoding: str):
    """In UTF-16 the byte scan sees an escaped quote as a real one: what follows looks like a string, and
    nesting or a lone surrogate would pass unseen to a parser that reads UTF-16 itself."""
    problem = refused(parse_json, text.encode(encoding, "surrogatepass"), LIMITS)
    assert problem.status == 400 and "not" in problem.message


async def test_load_json_parses_a_large_body_off_the_event_loop(monkeypatch):
    import threading

    from skyrl_core import http_hygiene

    threads = []
    real = http_hygiene.check_json_structure
    monkeypatch.setattr(http_hygiene, "check_json_structure",
                        lambda data, limits: threads.append(threading.get_ident()) or real(data, limits))
    small, large = b"[1]", b"[" + b"1," * 200_000 + b"1]"
    assert await load_json(small, HttpLimits(max_json_items=10**6)) == [1]
    assert len(await load_json(large, HttpLimits(max_json_items=10**6))) == 200_001
    assert threads[0] == threading.get_ident() and threads[1] != threading.get_ident()


# --- errors ----------------------------------------------------------------------------------------------------------


def test_values_are_quoted_short_and_messages_are_capped():
    assert shown("abc") == "'abc'" and shown("x" * 10_000) == "'" + "x" * 76 + "..."
    assert len(shown(10**400)) == 80
    capped = json.loads(error_body("y" * 50_000))["detail"]
    assert len(capped) == MAX_MESSAGE_CHARS and capped.endswith("...")


def test_errors_never_repeat_the_input_and_are_ascii_json():
    huge = "x" * 100_000
    detail = validation_detail([{"loc": ("body", "queries", 0), "msg": "String should have at most 10 characters",
                                 "input": huge, "type": "string_too_long"}])
    assert huge not in detail and "body.queries.0" in detail and "at most 10" in detail
    listed = validation_errors([{"loc": ("body", "k\ud800" + "y" * 500), "msg": "bad", "input": huge, "type": "t"}] * 20)
    assert len(listed) == 10 and listed[0] == {"type": "t", "loc": ["body", "k\\ud800" + "y" * 198], "msg": "bad"}
    json.dumps(listed, ensure_ascii=False).encode("utf-8")  # no text that cannot be encoded is left
    body = error_body("caf\u00e9 \ud800")
    assert body.isascii() and json.loads(body) == {"detail": "caf\u00e9 \ud800"}


# --- the ASGI middleware ---------------------------------------------------------------------------------------------


async def call_app(headers: dict[str, str], chunks: list[bytes], method: str = "POST", limits: HttpLimits = LIMITS
                   ) -> tuple[int, dict, bytes | None]:
    """Drive the middleware with ASGI messages; returns (status, response JSON, the body the app received)."""
    seen: dict[str, bytes] = {}

    async def app(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    incoming = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]
    sent: list[dict] = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/x",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    await HygieneMiddleware(app, limits)(scope, receive, send)
    status = sent[0]["status"]
    return status, json.loads(sent[1]["body"]), seen.get("body")


JSON_POST = {"host": "localhost", "content-type": "application/json"}


async def test_the_app_gets_the_checked_body_whole():
    status, answer, body = await call_app(JSON_POST, [b'{"a": ', b"[1, 2]", b"}"])
    assert status == 200 and answer == {"ok": True} and body == b'{"a": [1, 2]}'


async def test_a_streamed_body_past_the_limit_is_413_and_never_reaches_the_app():
    status, answer, body = await call_app({**JSON_POST, "transfer-encoding": "chunked"}, [b"[" + b"1," * 300] * 3)
    assert status == 413 and body is None and "limit" in answer["detail"]


@pytest.mark.parametrize(("headers", "chunks", "status"), [
    ({"host": "attacker.example", "content-type": "application/json"}, [b"{}"], 421),
    ({**JSON_POST, "origin": "http://attacker.example"}, [b"{}"], 403),
    ({"host": "localhost"}, [b""], 415),
    ({**JSON_POST, "content-encoding": "gzip", "content-length": "11"}, [b"[[[[[[]]]]]"], 415),
    ({"host": "localhost", "content-type": "text/plain", "content-length": "2"}, [b"{}"], 415),
    ({**JSON_POST, "content-length": "11"}, [b"[[[[[[]]]]]"], 400),
    ({**JSON_POST, "content-length": "10"}, [b'"\\udc00x"'], 400),
])
async def test_the_middleware_answers_each_problem_as_json(headers, chunks, status):
    got, answer, body = await call_app(headers, chunks)
    assert got == status and set(answer) == {"detail"} and body is None


async def test_a_client_that_goes_away_mid_body_is_answered_without_calling_the_app():
    status, _, body = await call_app({**JSON_POST, "transfer-encoding": "chunked"}, [])
    assert status == 400 and body is None


async def test_other_scopes_pass_through():
    called = []

    async def app(scope, receive, send):
        called.append(scope["type"])

    await HygieneMiddleware(app, LIMITS)({"type": "lifespan"}, None, None)
    assert called == ["lifespan"]

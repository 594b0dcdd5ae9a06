"""The admin API's HTTP reading and writing (proxy/admin/http.py), pure."""

from __future__ import annotations

import json

import pytest

from proxy.admin.http import (
    BadRequest,
    authorized,
    error_response,
    head_end,
    json_response,
    parse_head,
)

TOKEN = "s3cr3t-t0ken-0123456789"


def test_a_request_head_is_read_with_its_path_query_and_headers():
    head = (
        b"GET /v1/topics/my%20topic?verbose=1 HTTP/1.1\r\nHost: x\r\n"
        b"Authorization:  Bearer abc \r\n\r\n"
    )
    assert head_end(head[:-2]) == -1 and head_end(head + b"junk") == len(head)
    request = parse_head(head)
    assert request.method == "GET" and request.path == "/v1/topics/my topic"
    assert request.query == {"verbose": ["1"]}
    assert request.headers == {"host": "x", "authorization": "Bearer abc"}


@pytest.mark.parametrize(
    ("head", "status", "words"),
    [
        (b"POST /v1/topics HTTP/1.1\r\n\r\n", 405, "method 'POST' not allowed"),
        (b"GET /v1/topics\r\n\r\n", 400, "bad request line"),
        (b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n", 400, "bad header line"),
        (b"GET /x HTTP/1.1\r\n Folded: no\r\n\r\n", 400, "bad header line"),
        (b"\x16\x03\x01 TLS hello\r\n\r\n", 400, "bad request line"),
    ],
)
def test_a_request_it_cannot_read_is_answered_with_the_reason(head, status, words):
    with pytest.raises(BadRequest) as bad:
        parse_head(head)
    assert bad.value.status == status and words in str(bad.value)


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        (None, False),
        ("Bearer " + TOKEN, True),
        ("bearer " + TOKEN, True),  # the scheme is case-insensitive, the token is not
        ("Bearer " + TOKEN.upper(), False),
        ("Bearer " + TOKEN[:-1], False),
        ("Bearer " + TOKEN + "x", False),
        ("Basic " + TOKEN, False),
        ("Bearer", False),
    ],
)
def test_the_bearer_token_must_match_exactly(header, allowed):
    head = b"GET /v1/fleet HTTP/1.1\r\n"
    if header is not None:
        head += f"Authorization: {header}\r\n".encode()
    request = parse_head(head + b"\r\n")
    assert authorized(request, TOKEN) is allowed
    assert authorized(request, None)  # no token configured: loopback only, open


def test_answers_are_framed_with_length_and_close():
    answer = json_response(200, {"ready": True})
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK"
    assert f"Content-Length: {len(body)}" in lines and "Connection: close" in lines
    assert json.loads(body) == {"ready": True}
    assert json_response(200, {"ready": True}, head_only=True) == head + b"\r\n\r\n"
    unauthorized = json_response(401, {"error": "x"})
    assert b'WWW-Authenticate: Bearer realm="tierproxy"' in unauthorized
    assert error_response(404, "no such path").startswith(b"HTTP/1.1 404 Not Found\r\n")

"""The little HTTP/1.1 the admin API speaks (pure: bytes in, bytes out, no sockets).

GET and HEAD only, one request per connection (`Connection: close`), no request body:
probes, `curl` and Prometheus need nothing more. A request head is bounded
(MAX_HEAD_BYTES); anything else is answered with a 4xx naming what was wrong.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

MAX_HEAD_BYTES = 16 * 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class BadRequest(ValueError):
    """A request the admin API cannot read; `status` is the answer's status code."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # percent-decoded, without the query
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased


def head_end(buffer: bytes) -> int:
    """Where the head ends (after its blank line), or -1 while incomplete."""
    end = buffer.find(b"\r\n\r\n")
    return -1 if end < 0 else end + 4


def parse_head(head: bytes) -> Request:
    """The request line and headers of one request head (without or with its blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # latin-1 decodes anything; kept for clarity of intent
        raise BadRequest(400, "request head is not text") from None
    lines = text.rstrip("\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, f"bad request line {lines[0][:80]!r}")
    method, target, _ = parts
    if method not in ("GET", "HEAD"):
        raise BadRequest(405, f"method {method[:16]!r} not allowed: GET or HEAD")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, f"bad header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    split = urlsplit(target)
    return Request(method, unquote(split.path), parse_qs(split.query), headers)


def authorized(request: Request, token: str | None) -> bool:
    """Whether the request carries the bearer token (always, when there is none). The
    comparison takes the same time wherever the first wrong character is."""
    if token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def response(
    status: int,
    body: bytes,
    content_type: str,
    *,
    head_only: bool = False,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def json_response(status: int, value: object, *, head_only: bool = False) -> bytes:
    body = (json.dumps(value, indent=2, sort_keys=False) + "\n").encode()
    extra = (("WWW-Authenticate", 'Bearer realm="tierproxy"'),) if status == 401 else ()
    return response(status, body, "application/json", head_only=head_only, extra=extra)


def error_response(status: int, message: str) -> bytes:
    return json_response(status, {"error": message})

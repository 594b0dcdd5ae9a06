"""SASL for the proxy's own control connection: PLAIN and SCRAM-SHA-256/512 (RFC 5802/7677).

Clients never go through this module: their SaslHandshake and SaslAuthenticate travel
untouched on their own upstream connections. The proxy authenticates only when it asks
upstream for metadata itself. Pure: messages in, messages out; the nonce is passed in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from proxy.kafka.frames import FrameError
from proxy.kafka.wire import read_int16, read_int32, read_string, read_uvarint

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class SaslError(Exception):
    """Authentication failed or the server's answer does not prove it knows the password."""


def plain_message(username: str, password: str) -> bytes:
    return b"\0" + username.encode() + b"\0" + password.encode()


class ScramClient:
    """One SCRAM exchange: `first_message`, then `final_message(server_first)`, then
    `verify(server_final)`."""

    def __init__(
        self, mechanism: str, username: str, password: str, nonce: str | None = None
    ) -> None:
        if mechanism not in _HASHES:
            raise ValueError(f"{mechanism} is not a SCRAM mechanism")
        self._hash = _HASHES[mechanism]
        self._password = password.encode()
        self._nonce = nonce or secrets.token_urlsafe(24)
        user = username.replace("=", "=3D").replace(",", "=2C")
        self._client_first_bare = f"n={user},r={self._nonce}"
        self._server_signature: bytes | None = None

    def first_message(self) -> bytes:
        return f"n,,{self._client_first_bare}".encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = _fields(text)
        nonce, salt, iterations = fields.get("r"), fields.get("s"), fields.get("i")
        if "e" in fields:
            raise SaslError(f"server refused: {fields['e']}")
        if not nonce or not salt or not iterations or not iterations.isdigit():
            raise SaslError(f"malformed server-first message {text!r}")
        if not nonce.startswith(self._nonce):
            raise SaslError("server nonce does not extend the client's")
        salted = hashlib.pbkdf2_hmac(
            self._hash, self._password, base64.b64decode(salt), int(iterations)
        )
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._client_first_bare},{text},{without_proof}".encode()
        client_key = self._hmac(salted, b"Client Key")
        signature = self._hmac(hashlib.new(self._hash, client_key).digest(), auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        fields = _fields(server_final.decode())
        if "e" in fields:
            raise SaslError(f"server refused: {fields['e']}")
        expected = self._server_signature
        if expected is None or base64.b64decode(fields.get("v", "")) != expected:
            raise SaslError("the server's signature is wrong: it does not know the password")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()


def _fields(message: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in message.split(",") if len(part) >= 2 and part[1] == "="}


def parse_handshake_response(body: memoryview) -> tuple[int, list[str]]:
    """SaslHandshake v1 answer: (error code, mechanisms the listener enables)."""
    error_code, offset = read_int16(body, 0)
    count, offset = read_int32(body, offset)
    mechanisms = []
    for _ in range(max(count, 0)):
        name, offset = read_string(body, offset, compact=False)
        mechanisms.append(name or "")
    return error_code, mechanisms


def parse_authenticate_response(body: memoryview) -> tuple[int, str | None, bytes]:
    """SaslAuthenticate v2 answer: (error code, error message, auth bytes)."""
    error_code, offset = read_int16(body, 0)
    message, offset = read_string(body, offset, compact=True)
    length, offset = read_uvarint(body, offset)
    if length == 0 or offset + length - 1 > len(body):
        raise FrameError("malformed SaslAuthenticate answer: bad auth_bytes length")
    return error_code, message, bytes(body[offset : offset + length - 1])

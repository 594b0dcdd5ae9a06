"""The HAProxy PROXY protocol, versions 1 (text) and 2 (binary): the header a TCP load
balancer sends before the client's own bytes, naming the client's real address.

Pure functions, no sockets. The adapter reads the first 4 bytes of a connection (a Kafka
connection sends its first frame size there anyway), asks `detect()`, and if a header
follows, reads exactly as many more bytes as `parse()` says it still needs:

    buf = await reader.readexactly(4)
    if detect(buf) != "none":
        while (result := parse(buf))[0] is None:
            buf += await reader.readexactly(result[1])
        header, size = result  # size == len(buf): parse never asks for a byte too many

`needed` is always a lower bound on what is left of the header, so the adapter never reads
into the Kafka bytes behind it. `header_length()` (v2) and `v1_line_end()` (v1) serve an
adapter that prefers to size its reads itself.

A header's `source_address` is None when the connection's own peer must be used instead:
v2 LOCAL (the balancer's health checks), v1 UNKNOWN, v2 AF_UNSPEC.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from proxy.kafka.frames import FrameError

PROXY_V1_PREFIX = b"PROXY "
PROXY_V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_MAX_LINE = 107  # bytes, CRLF included
V1_MIN_LINE = len(b"PROXY UNKNOWN\r\n")
V2_FIXED = 16  # signature, version/command, family/transport, length

Family = Literal["inet", "inet6", "unix", "unspec"]

_V2_TAIL = struct.Struct(">BBH")  # version/command, family/transport, length
_PORTS = struct.Struct(">HH")
_TLV = struct.Struct(">BH")
_UNIX_PATH = 108  # bytes per address, NUL padded
_ADDRESS_BYTES = {"inet": 12, "inet6": 36, "unix": 2 * _UNIX_PATH}
# The family/transport bytes the spec defines; any other must be rejected. DGRAM is
# accepted: the address is all the proxy wants.
_FAMILIES: dict[int, Family] = {
    0x00: "unspec",
    0x11: "inet",
    0x12: "inet",
    0x21: "inet6",
    0x22: "inet6",
    0x31: "unix",
    0x32: "unix",
}
_V1_PORT = re.compile(r"[0-9]{1,5}")
_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


class ProxyHeaderError(FrameError):
    """Bytes that are not a valid PROXY header; the connection must close."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    version: Literal[1, 2]
    command: Literal["proxy", "local"]
    family: Family  # "unspec" whenever the addresses are None
    source_address: str | None  # IP address text (compressed) or a UNIX socket path
    source_port: int | None  # None for UNIX sockets and without addresses
    destination_address: str | None
    destination_port: int | None


def detect(first_bytes: bytes | bytearray | memoryview) -> Literal["v1", "v2", "none", "need_more"]:
    """Whether a connection starting with these bytes opens with a PROXY header.

    Only the first four bytes are looked at, so four bytes always decide. They cannot be
    mistaken for a Kafka frame size: "PROX" read as an int32 is 0x50524F58 (1,347,571,544)
    and the v2 signature's "\\r\\n\\r\\n" is 0x0D0A0D0A (218,762,506), both far above
    Kafka's 100 MiB socket.request.max.bytes; the answer holds as long as the proxy's
    max_frame_bytes stays below 218,762,506. `parse()` checks the rest of the signature.
    """
    head = bytes(first_bytes[:4])
    for kind, signature in (("v1", PROXY_V1_PREFIX), ("v2", PROXY_V2_SIGNATURE)):
        if signature.startswith(head):
            return kind if len(head) == 4 else "need_more"
    return "none"


def parse(buf: bytes | bytearray | memoryview) -> tuple[ProxyHeader | None, int]:
    """Read the PROXY header at the start of buf, v1 or v2.

    Returns (header, size) once the whole header is in buf: the bytes after `size` belong
    to the client. Returns (None, needed) while it is not, needed >= 1 being a lower bound
    on the bytes still to come, so reading exactly that many never reads past the header.
    Raises ProxyHeaderError as soon as the bytes cannot be a valid header.
    """
    view = memoryview(buf)
    kind = detect(view)
    if kind == "need_more":
        return None, V1_MIN_LINE - len(view)  # no header is shorter than a v1 line
    if kind == "v1":
        return _parse_v1(view)
    if kind == "v2":
        return _parse_v2(view)
    raise ProxyHeaderError(f"no PROXY header: connection starts with {bytes(view[:4])!r}")


def header_length(first_16_bytes: bytes | bytearray | memoryview) -> int:
    """The whole size of the v2 header that starts with these 16 bytes (16 + its length).

    Raises ProxyHeaderError for a bad signature or a version other than 2, ValueError if
    given fewer than 16 bytes.
    """
    head = memoryview(first_16_bytes)[:V2_FIXED]
    if len(head) < V2_FIXED:
        raise ValueError(f"header_length needs the first {V2_FIXED} bytes, got {len(head)}")
    _check_v2_signature(head)
    version_command, _, length = _V2_TAIL.unpack_from(head, 12)
    if version_command >> 4 != 2:
        raise ProxyHeaderError(f"PROXY v2 header: version {version_command >> 4}, expected 2")
    return V2_FIXED + length


def v1_line_end(buf: bytes | bytearray | memoryview) -> int | None:
    """The size of the v1 line at the start of buf, its CRLF included, or None if buf holds
    no CRLF yet. Raises ProxyHeaderError once 107 bytes hold none, or on a bare LF."""
    head = bytes(memoryview(buf)[:V1_MAX_LINE])
    newline = head.find(b"\n")
    if newline == -1:
        if len(head) == V1_MAX_LINE:
            raise ProxyHeaderError(f"PROXY v1 header: no CRLF in the first {V1_MAX_LINE} bytes")
        return None
    if newline == 0 or head[newline - 1] != ord("\r"):
        raise ProxyHeaderError(f"PROXY v1 header: LF without CR at byte {newline}")
    return newline + 1


def encode_v1(source: tuple[str, int] | None, destination: tuple[str, int] | None) -> bytes:
    """A v1 line: TCP4 or TCP6 after the addresses' family, UNKNOWN when both are None."""
    if source is None and destination is None:
        return b"PROXY UNKNOWN\r\n"
    family, src, sport, dst, dport = _ip_pair(source, destination)
    protocol = "TCP4" if family == "inet" else "TCP6"
    return f"PROXY {protocol} {src} {dst} {sport} {dport}\r\n".encode("ascii")


def encode_v2(
    source: tuple[str, int] | str | None,
    destination: tuple[str, int] | str | None,
    tlvs: Iterable[tuple[int, bytes]] = (),
) -> bytes:
    """A v2 header over TCP: (address, port) pairs, or UNIX socket paths as str; LOCAL when
    both are None. tlvs are (type, value) pairs appended after the addresses."""
    if source is None and destination is None:
        command, family_byte, addresses = 0x20, 0x00, b""
    elif isinstance(source, str) and isinstance(destination, str):
        command, family_byte = 0x21, 0x31
        addresses = _unix_path_bytes(source) + _unix_path_bytes(destination)
    elif isinstance(source, str) or isinstance(destination, str):
        raise ValueError("give two UNIX socket paths, or two (address, port) pairs")
    else:
        family, src, sport, dst, dport = _ip_pair(source, destination)
        command, family_byte = 0x21, (0x11 if family == "inet" else 0x21)
        addresses = src.packed + dst.packed + _PORTS.pack(sport, dport)
    extensions = b"".join(_tlv(kind, value) for kind, value in tlvs)
    length = len(addresses) + len(extensions)
    if length > 0xFFFF:
        raise ValueError(f"PROXY v2 header of {length} bytes after the fixed part, max 65535")
    return PROXY_V2_SIGNATURE + _V2_TAIL.pack(command, family_byte, length) + addresses + extensions


# --- v1 ----------------------------------------------------------------------------------


def _parse_v1(view: memoryview) -> tuple[ProxyHeader | None, int]:
    have = bytes(view[: len(PROXY_V1_PREFIX)])
    if not PROXY_V1_PREFIX.startswith(have):
        raise ProxyHeaderError(f"PROXY v1 header: bad signature {have!r}")
    end = v1_line_end(view)
    if end is None:
        at_least = 1 if view[len(view) - 1 :] == b"\r" else 2
        return None, max(at_least, V1_MIN_LINE - len(view))
    line = bytes(view[: end - 2])
    if line.split(b" ", 2)[1] == b"UNKNOWN":  # the rest of the line is to be ignored
        return ProxyHeader(1, "proxy", "unspec", None, None, None, None), end
    if not line.isascii():
        raise ProxyHeaderError("PROXY v1 header: non-ASCII bytes in the line")
    fields = line.decode("ascii").split(" ")
    if fields[1] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"PROXY v1 header: unknown protocol {fields[1]!r}")
    if len(fields) != 6:
        raise ProxyHeaderError(
            f"PROXY v1 header: {len(fields) - 2} fields after {fields[1]}, expected 4 "
            "(source and destination address, source and destination port)"
        )
    family: Family = "inet" if fields[1] == "TCP4" else "inet6"
    src, dst = (_v1_address(fields[1], family, text) for text in fields[2:4])
    sport, dport = (_v1_port(text) for text in fields[4:6])
    return ProxyHeader(1, "proxy", family, src, sport, dst, dport), end


def _v1_address(protocol: str, family: Family, text: str) -> str:
    kind = ipaddress.IPv4Address if family == "inet" else ipaddress.IPv6Address
    try:
        address = kind(text)
    except ValueError:
        address = None
    if address is None or getattr(address, "scope_id", None) is not None:
        raise ProxyHeaderError(f"PROXY v1 header: bad {protocol} address {text!r}")
    return str(address)


def _v1_port(text: str) -> int:
    if not _V1_PORT.fullmatch(text):
        raise ProxyHeaderError(f"PROXY v1 header: bad port {text!r}")
    port = int(text)
    if port > 0xFFFF:
        raise ProxyHeaderError(f"PROXY v1 header: port {port} out of range 0-65535")
    return port


# --- v2 ----------------------------------------------------------------------------------


def _check_v2_signature(view: memoryview) -> None:
    have = bytes(view[: len(PROXY_V2_SIGNATURE)])
    if not PROXY_V2_SIGNATURE.startswith(have):
        raise ProxyHeaderError(f"PROXY v2 header: bad signature {have!r}")


def _parse_v2(view: memoryview) -> tuple[ProxyHeader | None, int]:
    if len(view) < V2_FIXED:
        _check_v2_signature(view)
        if len(view) > 12 and view[12] >> 4 != 2:
            raise ProxyHeaderError(f"PROXY v2 header: version {view[12] >> 4}, expected 2")
        return None, V2_FIXED - len(view)
    size = header_length(view)
    if len(view) < size:
        return None, size - len(view)
    version_command, family_byte, length = _V2_TAIL.unpack_from(view, 12)
    command = version_command & 0x0F
    if command == 0x0:  # LOCAL: the block, family included, is to be ignored
        return ProxyHeader(2, "local", "unspec", None, None, None, None), size
    if command != 0x1:
        raise ProxyHeaderError(f"PROXY v2 header: unknown command {command:#x}")
    family = _FAMILIES.get(family_byte)
    if family is None:
        raise ProxyHeaderError(f"PROXY v2 header: unknown family/transport {family_byte:#04x}")
    if family == "unspec":  # the receiver should ignore any address information
        return ProxyHeader(2, "proxy", "unspec", None, None, None, None), size
    needed = _ADDRESS_BYTES[family]
    if length < needed:
        raise ProxyHeaderError(
            f"PROXY v2 header: length {length} too short for AF_{family.upper()} "
            f"addresses ({needed} bytes)"
        )
    block = view[V2_FIXED:size]
    _check_tlvs(block[needed:])
    if family == "unix":
        src, dst = (_unix_path(block[i : i + _UNIX_PATH]) for i in (0, _UNIX_PATH))
        return ProxyHeader(2, "proxy", family, src, None, dst, None), size
    width = 4 if family == "inet" else 16
    src_ip = ipaddress.ip_address(bytes(block[:width]))
    dst_ip = ipaddress.ip_address(bytes(block[width : 2 * width]))
    sport, dport = _PORTS.unpack_from(block, 2 * width)
    return ProxyHeader(2, "proxy", family, str(src_ip), sport, str(dst_ip), dport), size


def _check_tlvs(block: memoryview) -> None:
    """TLVs are skipped, but each must fit in the header's length."""
    offset = 0
    while offset < len(block):
        if len(block) - offset < _TLV.size:
            raise ProxyHeaderError(
                f"PROXY v2 header: {len(block) - offset} stray bytes after the TLVs"
            )
        kind, length = _TLV.unpack_from(block, offset)
        offset += _TLV.size + length
        if offset > len(block):
            raise ProxyHeaderError(
                f"PROXY v2 header: TLV type {kind:#04x} of {length} bytes overruns the header"
            )


def _unix_path(raw: memoryview) -> str:
    return bytes(raw).split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")


# --- encoding helpers --------------------------------------------------------------------


def _ip_pair(
    source: tuple[str, int] | None, destination: tuple[str, int] | None
) -> tuple[Family, _IP, int, _IP, int]:
    """(family, source address, port, destination address, port), checked for encoding."""
    if source is None or destination is None:
        raise ValueError("give both source and destination, or neither")
    src, dst = ipaddress.ip_address(source[0]), ipaddress.ip_address(destination[0])
    if src.version != dst.version:
        raise ValueError(f"source {src} and destination {dst} are of different families")
    for port in (source[1], destination[1]):
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"port {port} out of range 0-65535")
    return ("inet" if src.version == 4 else "inet6"), src, source[1], dst, destination[1]


def _unix_path_bytes(path: str) -> bytes:
    raw = path.encode("utf-8", "surrogateescape")
    if len(raw) > _UNIX_PATH or b"\x00" in raw:
        raise ValueError(f"UNIX socket path {path!r} is not a path of at most 108 bytes")
    return raw.ljust(_UNIX_PATH, b"\x00")


def _tlv(kind: int, value: bytes) -> bytes:
    if not 0 <= kind <= 0xFF or len(value) > 0xFFFF:
        raise ValueError(f"TLV type {kind} with {len(value)} bytes does not fit")
    return _TLV.pack(kind, len(value)) + value

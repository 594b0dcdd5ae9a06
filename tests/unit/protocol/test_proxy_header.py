import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest

from proxy.kafka.codec import encode
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, FrameError, frame
from proxy.kafka.headers import request_header
from proxy.kafka.proxy_header import (
    PROXY_V1_PREFIX,
    PROXY_V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    detect,
    encode_v1,
    encode_v2,
    header_length,
    parse,
    v1_line_end,
)

KAFKA_DATA = b"\x00\x00\x00\x10rest of the client's bytes"
NO_ADDRESS = (None, None, None, None)


def v2(version_command: int, family: int, block: bytes) -> bytes:
    return PROXY_V2_SIGNATURE + struct.pack(">BBH", version_command, family, len(block)) + block


def api_versions_frame() -> bytes:
    body = encode(ApiVersionsRequest(client_software_name="x", client_software_version="1"))
    return frame(request_header(18, 3, 1, "client") + body)


# --- detect ------------------------------------------------------------------------------


def test_signatures():
    assert PROXY_V1_PREFIX == b"PROXY "
    assert PROXY_V2_SIGNATURE == bytes.fromhex("0D0A0D0A000D0A515549540A")


@pytest.mark.parametrize(
    ("first", "kind"),
    [
        (b"PROX", "v1"),
        (b"PROXY TCP4 ", "v1"),
        (b"\r\n\r\n", "v2"),
        (PROXY_V2_SIGNATURE, "v2"),
        (b"", "need_more"),
        (b"P", "need_more"),
        (b"PRO", "need_more"),
        (b"\r\n\r", "need_more"),
        (b"\x00", "none"),
        (b"\x00\x00\x00\x10", "none"),
        (b"PRX", "none"),
        (b"\r\r", "none"),
    ],
)
def test_detect(first, kind):
    assert detect(first) == kind


def test_an_api_versions_request_is_not_a_proxy_header():
    first = api_versions_frame()[:4]
    assert detect(first) == "none"
    assert detect(api_versions_frame()) == "none"
    with pytest.raises(ProxyHeaderError, match="no PROXY header"):
        parse(api_versions_frame())


def test_both_signatures_read_as_frame_sizes_are_far_over_the_limit():
    for signature in (PROXY_V1_PREFIX, PROXY_V2_SIGNATURE):
        (size,) = struct.unpack(">i", signature[:4])
        assert size > 2 * DEFAULT_MAX_FRAME_BYTES


# --- v1 ----------------------------------------------------------------------------------


def test_v1_tcp4():
    line = b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"
    assert parse(line + KAFKA_DATA) == (
        ProxyHeader(1, "proxy", "inet", "192.168.0.1", 56324, "192.168.0.11", 443),
        len(line),
    )


def test_v1_tcp6_address_is_normalized():
    line = b"PROXY TCP6 2001:DB8:0:0::1 ::ffff:10.0.0.1 0 65535\r\n"
    header, size = parse(line)
    assert size == len(line)
    assert header == ProxyHeader(1, "proxy", "inet6", "2001:db8::1", 0, "::ffff:a00:1", 65535)


@pytest.mark.parametrize(
    "line",
    [
        b"PROXY UNKNOWN\r\n",
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        b"PROXY UNKNOWN \xff anything\r\n",
    ],
)
def test_v1_unknown_has_no_address(line):
    assert parse(line + KAFKA_DATA) == (ProxyHeader(1, "proxy", "unspec", *NO_ADDRESS), len(line))


def test_v1_longest_line_fits():
    src = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    line = f"PROXY TCP6 {src} {src} 65535 65535\r\n".encode()
    assert len(line) == 104
    assert parse(line)[1] == 104
    unknown = b"PROXY UNKNOWN " + b"x" * 91 + b"\r\n"
    assert len(unknown) == 107
    assert parse(unknown)[1] == 107


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"PROXY TCP4 " + b"1" * 120, "no CRLF in the first 107 bytes"),
        (b"PROXY UNKNOWN " + b"x" * 92 + b"\r\n", "no CRLF in the first 107 bytes"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "LF without CR"),
        (b"PROXZ TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "v1 header: bad signature"),
        (b"PROXY\r\n", "v1 header: bad signature"),
        (b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", "unknown protocol 'TCP5'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "3 fields after TCP4, expected 4"),
        (b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "5 fields after TCP4, expected 4"),
        (b"PROXY TCP4 1.2.3.400 5.6.7.8 1 2\r\n", "bad TCP4 address '1.2.3.400'"),
        (b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n", "bad TCP4 address '::1'"),
        (b"PROXY TCP6 ::1 1.2.3.4 1 2\r\n", "bad TCP6 address '1.2.3.4'"),
        (b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "bad TCP6 address 'fe80::1%eth0'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "port 65536 out of range 0-65535"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 -2\r\n", "bad port '-2'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 100000\r\n", "bad port '100000'"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa1 2\r\n", "non-ASCII"),
    ],
)
def test_v1_malformed(line, message):
    with pytest.raises(ProxyHeaderError, match=message) as caught:
        parse(line)
    assert isinstance(caught.value, FrameError)
    assert str(caught.value).startswith("PROXY v1 header: ")


def test_v1_incomplete_asks_for_no_more_than_the_rest():
    line = b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"
    for cut in range(len(line)):
        header, needed = parse(line[:cut])
        assert header is None
        assert 1 <= needed <= len(line) - cut


def test_v1_line_end():
    assert v1_line_end(b"PROXY UNKNOWN\r\n" + KAFKA_DATA) == 15
    assert v1_line_end(b"PROXY UNKNOWN\r") is None
    assert v1_line_end(b"x" * 106) is None
    with pytest.raises(ProxyHeaderError, match="no CRLF in the first 107 bytes"):
        v1_line_end(b"x" * 107)
    with pytest.raises(ProxyHeaderError, match="LF without CR at byte 0"):
        v1_line_end(b"\n")


# --- v2 ----------------------------------------------------------------------------------


def test_v2_proxy_ipv4():
    block = bytes([10, 0, 0, 1, 10, 0, 0, 2]) + struct.pack(">HH", 40000, 9092)
    data = v2(0x21, 0x11, block)
    assert parse(data + KAFKA_DATA) == (
        ProxyHeader(2, "proxy", "inet", "10.0.0.1", 40000, "10.0.0.2", 9092),
        16 + 12,
    )
    assert header_length(data[:16]) == 28


def test_v2_proxy_ipv6():
    src = bytes.fromhex("20010db8000000000000000000000001")
    dst = bytes(15) + b"\x01"
    data = v2(0x21, 0x21, src + dst + struct.pack(">HH", 1, 2))
    assert parse(data) == (ProxyHeader(2, "proxy", "inet6", "2001:db8::1", 1, "::1", 2), 52)


def test_v2_proxy_unix():
    block = b"/run/src.sock".ljust(108, b"\x00") + b"/run/dst.sock".ljust(108, b"\x00")
    data = v2(0x21, 0x31, block)
    assert parse(data) == (
        ProxyHeader(2, "proxy", "unix", "/run/src.sock", None, "/run/dst.sock", None),
        16 + 216,
    )


def test_v2_udp_is_read_too():
    data = v2(0x21, 0x12, bytes([1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 2]))
    assert parse(data)[0] == ProxyHeader(2, "proxy", "inet", "1.2.3.4", 1, "5.6.7.8", 2)


@pytest.mark.parametrize("family", [0x00, 0x11, 0x21, 0x31, 0xFF])
def test_v2_local_ignores_the_block_whatever_the_family(family):
    data = v2(0x20, family, b"\x01\x02\x03")
    assert parse(data + KAFKA_DATA) == (ProxyHeader(2, "local", "unspec", *NO_ADDRESS), 19)


def test_v2_proxy_unspec_has_no_address():
    assert parse(v2(0x21, 0x00, b"ignored")) == (
        ProxyHeader(2, "proxy", "unspec", *NO_ADDRESS),
        23,
    )


def test_v2_tlvs_are_skipped():
    tlvs = [(0x01, b"h2"), (0x04, b""), (0xE0, b"x" * 300)]
    data = encode_v2(("10.1.2.3", 1234), ("10.0.0.1", 9092), tlvs)
    assert len(data) == 16 + 12 + (3 + 2) + 3 + (3 + 300)
    header, size = parse(data + KAFKA_DATA)
    assert size == len(data)
    assert header == ProxyHeader(2, "proxy", "inet", "10.1.2.3", 1234, "10.0.0.1", 9092)


def address_block_v4() -> bytes:
    return bytes(8) + struct.pack(">HH", 1, 2)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\r\n\r\n\x00\r\nQUIX\n" + bytes(4), "v2 header: bad signature"),
        (b"\r\n\r\n\x01", "v2 header: bad signature"),
        (v2(0x11, 0x11, address_block_v4()), "version 1, expected 2"),
        (v2(0x31, 0x11, address_block_v4()), "version 3, expected 2"),
        (PROXY_V2_SIGNATURE + b"\x11", "version 1, expected 2"),
        (v2(0x22, 0x11, address_block_v4()), "unknown command 0x2"),
        (v2(0x21, 0x13, address_block_v4()), "unknown family/transport 0x13"),
        (v2(0x21, 0x41, address_block_v4()), "unknown family/transport 0x41"),
        (v2(0x21, 0x11, bytes(8)), "length 8 too short for AF_INET addresses \\(12 bytes\\)"),
        (v2(0x21, 0x21, bytes(12)), "length 12 too short for AF_INET6 addresses \\(36 bytes\\)"),
        (v2(0x21, 0x31, bytes(108)), "length 108 too short for AF_UNIX addresses \\(216 bytes\\)"),
        (v2(0x21, 0x11, address_block_v4() + b"\x01\x00"), "2 stray bytes after the TLVs"),
        (
            v2(0x21, 0x11, address_block_v4() + b"\x01\x00\x05abcd"),
            "TLV type 0x01 of 5 bytes overruns the header",
        ),
    ],
)
def test_v2_malformed(data, message):
    with pytest.raises(ProxyHeaderError, match=message) as caught:
        parse(data)
    assert isinstance(caught.value, FrameError)
    assert str(caught.value).startswith("PROXY v2 header: ")


def test_header_length():
    data = encode_v2(("::1", 1), ("::2", 2), [(0x01, b"abc")])
    assert header_length(data[:16]) == len(data) == 16 + 36 + 6
    assert header_length(data) == len(data)
    with pytest.raises(ProxyHeaderError, match="version 1, expected 2"):
        header_length(PROXY_V2_SIGNATURE + b"\x11\x11\x00\x0c")
    with pytest.raises(ProxyHeaderError, match="bad signature"):
        header_length(b"PROXY TCP4 1.2.3.4 ")
    with pytest.raises(ValueError, match="first 16 bytes, got 15"):
        header_length(data[:15])


def test_v2_incomplete_asks_for_no_more_than_the_rest():
    data = encode_v2(("10.0.0.1", 1), ("10.0.0.2", 2), [(0x02, b"authority")])
    for cut in range(len(data)):
        header, needed = parse(data[:cut])
        assert header is None
        assert 1 <= needed <= len(data) - cut


def test_reading_what_parse_asks_for_stops_exactly_at_the_header_end():
    for data in (
        encode_v1(("1.2.3.4", 5), ("6.7.8.9", 10)),
        encode_v1(None, None),
        encode_v2(("::1", 5), ("::2", 6), [(1, b"x")]),
        encode_v2(None, None),
    ):
        stream = data + KAFKA_DATA
        buf = stream[:4]
        assert detect(buf) != "none"
        while (result := parse(buf))[0] is None:
            buf += stream[len(buf) : len(buf) + result[1]]
        assert result[1] == len(buf) == len(data)


# --- encoders ----------------------------------------------------------------------------


def test_encode_v1():
    assert encode_v1(("10.0.0.1", 5555), ("10.0.0.2", 9092)) == (
        b"PROXY TCP4 10.0.0.1 10.0.0.2 5555 9092\r\n"
    )
    assert encode_v1(("::1", 1, 0, 0), ("::2", 2, 0, 0)) == b"PROXY TCP6 ::1 ::2 1 2\r\n"
    assert encode_v1(None, None) == b"PROXY UNKNOWN\r\n"


def test_encode_v2_local():
    assert encode_v2(None, None) == PROXY_V2_SIGNATURE + b"\x20\x00\x00\x00"


@pytest.mark.parametrize(
    ("source", "destination", "message"),
    [
        (("1.2.3.4", 1), None, "both source and destination"),
        (("1.2.3.4", 1), ("::1", 2), "different families"),
        (("1.2.3.4", 65536), ("1.2.3.5", 2), "port 65536 out of range"),
        (("not an address", 1), ("1.2.3.5", 2), "does not appear to be an IPv4 or IPv6"),
    ],
)
def test_encoders_refuse_what_they_cannot_encode(source, destination, message):
    for encoder in (encode_v1, encode_v2):
        with pytest.raises(ValueError, match=message):
            encoder(source, destination)


def test_encode_v2_refuses_bad_unix_paths_and_tlvs():
    with pytest.raises(ValueError, match="two UNIX socket paths"):
        encode_v2("/a", ("1.2.3.4", 1))
    with pytest.raises(ValueError, match="at most 108 bytes"):
        encode_v2("/" + "a" * 108, "/b")
    with pytest.raises(ValueError, match="TLV type 256"):
        encode_v2(None, None, [(256, b"")])
    with pytest.raises(ValueError, match="max 65535"):
        encode_v2(None, None, [(1, bytes(65535))])

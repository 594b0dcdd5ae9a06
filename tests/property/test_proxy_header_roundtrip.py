"""PROXY headers, v1 and v2, parse back to what was encoded; a prefix is only ever
incomplete; no input makes the parser raise anything but ProxyHeaderError."""

from hypothesis import given, settings
from hypothesis import strategies as st

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

ports = st.integers(min_value=0, max_value=0xFFFF)
tlvs = st.lists(st.tuples(st.integers(0, 0xFF), st.binary(max_size=40)), max_size=5)
unix_paths = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=27
)


@st.composite
def ip_endpoints(draw):
    """(source, destination, family): two (address, port) pairs of one family."""
    version = draw(st.sampled_from([4, 6]))
    source, destination = ((str(draw(st.ip_addresses(v=version))), draw(ports)) for _ in range(2))
    return source, destination, "inet" if version == 4 else "inet6"


def expected(version, family, source, destination):
    if family == "unix":
        return ProxyHeader(version, "proxy", family, source, None, destination, None)
    return ProxyHeader(version, "proxy", family, *source, *destination)


@st.composite
def encoded_headers(draw):
    """(bytes, the header they must parse to): v1 or v2, every family."""
    kind = draw(st.sampled_from(["v1", "v1 unknown", "v2", "v2 unix", "v2 local"]))
    if kind == "v1 unknown":
        return encode_v1(None, None), ProxyHeader(1, "proxy", "unspec", None, None, None, None)
    if kind == "v2 local":
        return encode_v2(None, None, draw(tlvs)), ProxyHeader(
            2, "local", "unspec", None, None, None, None
        )
    if kind == "v2 unix":
        source, destination = draw(unix_paths), draw(unix_paths)
        return encode_v2(source, destination, draw(tlvs)), expected(2, "unix", source, destination)
    source, destination, family = draw(ip_endpoints())
    if kind == "v1":
        return encode_v1(source, destination), expected(1, family, source, destination)
    return encode_v2(source, destination, draw(tlvs)), expected(2, family, source, destination)


@settings(max_examples=500, deadline=None)
@given(encoded=encoded_headers(), tail=st.binary(max_size=20))
def test_headers_parse_back_to_what_was_encoded(encoded, tail):
    data, header = encoded
    assert detect(data[:4]) == ("v1" if header.version == 1 else "v2")
    assert parse(data + tail) == (header, len(data))
    if header.version == 2:
        assert header_length(data[:16]) == len(data)
    else:
        assert v1_line_end(data + tail) == len(data)


@settings(max_examples=300, deadline=None)
@given(encoded=encoded_headers(), data=st.data())
def test_a_prefix_is_incomplete_never_wrong(encoded, data):
    full, _ = encoded
    cut = data.draw(st.integers(min_value=0, max_value=len(full) - 1))
    header, needed = parse(full[:cut])
    assert header is None
    assert 1 <= needed <= len(full) - cut  # reading that many never reads past the header


def v1_fields():
    tokens = st.one_of(
        st.sampled_from(["TCP4", "TCP6", "UNKNOWN", "", "1.2.3.4", "::1", "65535", "65536"]),
        st.ip_addresses().map(str),
        st.integers(-5, 100_000).map(str),
        st.text(max_size=8),
    )
    return st.lists(tokens, max_size=7).map(
        lambda fields: PROXY_V1_PREFIX + " ".join(fields).encode("utf-8", "replace")
    )


def mutated(encoded):
    data, _ = encoded
    return st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)).map(
        lambda change: data[: change[0]] + bytes([change[1]]) + data[change[0] + 1 :]
    )


anything = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(lambda rest: PROXY_V1_PREFIX + rest),
    st.binary(max_size=300).map(lambda rest: PROXY_V2_SIGNATURE + rest),
    st.tuples(v1_fields(), st.sampled_from([b"\r\n", b"\n", b"\r", b""])).map(b"".join),
    encoded_headers().flatmap(mutated),
)


@settings(max_examples=1000, deadline=None)
@given(data=anything)
def test_any_bytes_raise_nothing_but_proxy_header_error(data):
    assert detect(data) in ("v1", "v2", "none", "need_more")
    try:
        header, size = parse(data)
    except ProxyHeaderError:
        pass
    else:
        assert (header is None and size >= 1) or (header is not None and 0 < size <= len(data))
    try:
        v1_line_end(data)
    except ProxyHeaderError:
        pass
    if len(data) >= 16:
        try:
            assert header_length(data) >= 16
        except ProxyHeaderError:
            pass

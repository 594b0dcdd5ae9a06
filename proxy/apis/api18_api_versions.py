"""ApiVersions (api key 18), v0-v4: answered by the proxy itself, never forwarded.

The proxy offers what it can read (kio's schemas, `proxy_supported_ranges`) intersected
with what the upstream cluster answered and with configured caps (`intersect`).

A client asking with a version the proxy does not know gets what Kafka sends (KIP-511):
a v0-shaped answer, header v0, error UNSUPPORTED_VERSION, listing the ApiVersions range
alone, from which the client picks a version and asks again.

v3+ answers leave the tagged supported_features / finalized_features empty: clients
then take no feature-gated path (e.g. transactions v2), which suits a proxy that may cap
the APIs those paths need. ApiVersions responses always use header v0 (see `apis`).
"""

from __future__ import annotations

import datetime
import struct
from typing import get_args

from kio.schema.errors import ErrorCode

from proxy.kafka.codec import encode, load_response_types, response_type
from proxy.kafka.frames import FrameError
from proxy.kafka.headers import response_header
from proxy.kafka.schema_walk import field_offset, skip_entity
from proxy.kafka.versions import API_VERSIONS, APIS, supported_ranges
from proxy.kafka.wire import read_array_length, read_int16, read_string, skip_tagged_fields

API_KEY = API_VERSIONS
NONE = 0
UNSUPPORTED_VERSION = 35
RESPONSES = load_response_types(API_KEY)

Ranges = dict[int, tuple[int, int]]  # api key -> (min version, max version)
_API_VERSION = struct.Struct(">hhh")  # api_key, min_version, max_version


class ApiVersionsError(Exception):
    """Upstream answered ApiVersions with an error.

    For UNSUPPORTED_VERSION, `ranges` holds what it listed (at least its ApiVersions
    range), so the caller can ask again at a version both sides know.
    """

    def __init__(self, error_code: int, ranges: Ranges) -> None:
        super().__init__(f"ApiVersions failed with error code {error_code}")
        self.error_code = error_code
        self.ranges = ranges


def proxy_supported_ranges() -> Ranges:
    return supported_ranges()


def parse_api_versions_response(api_version: int, body: memoryview | bytes) -> Ranges:
    """Upstream's supported ranges; ApiVersionsError if it answered with an error."""
    body = memoryview(body)
    try:
        error_code, _ = read_int16(body, 0)  # first field in every version
        if error_code == UNSUPPORTED_VERSION:
            # Kafka answers a version it does not know in the v0 shape, whatever was asked.
            raise ApiVersionsError(error_code, _read_ranges(RESPONSES[0], body))
        if error_code != NONE:
            raise ApiVersionsError(error_code, {})
        return _read_ranges(response_type(RESPONSES, API_KEY, api_version), body)
    except FrameError as exc:
        raise FrameError(f"malformed ApiVersionsResponse v{api_version}: {exc}") from None


def intersect(upstream: Ranges, proxy: Ranges, caps: dict[int, int]) -> Ranges:
    """Versions both sides speak, at most caps[key]; keys left with none are dropped."""
    out = {}
    for api_key in upstream.keys() & proxy.keys():
        low = max(upstream[api_key][0], proxy[api_key][0])
        high = min(upstream[api_key][1], proxy[api_key][1], caps.get(api_key, 1 << 15))
        if low <= high:
            out[api_key] = (low, high)
    return dict(sorted(out.items()))


def encode_api_versions_response(
    api_version: int, ranges: Ranges, throttle_ms: int = 0, error_code: int = NONE
) -> bytes:
    """The body (no header) of an ApiVersions answer at a version the proxy knows."""
    response = response_type(RESPONSES, API_KEY, api_version)
    fields = {
        "error_code": ErrorCode(error_code),
        "api_keys": _api_keys(response, ranges),
    }
    if api_version >= 1:  # throttle_time_ms arrived in v1
        fields["throttle_time"] = datetime.timedelta(milliseconds=throttle_ms)
    return encode(response(**fields))


def unsupported_version_response(correlation_id: int, ranges: Ranges) -> bytes:
    """The whole answer (header v0 + v0 body, no size prefix) to an unknown version."""
    api_versions = APIS[API_KEY]
    own = ranges.get(API_KEY, (api_versions.min_version, api_versions.max_version))
    body = encode_api_versions_response(0, {API_KEY: own}, error_code=UNSUPPORTED_VERSION)
    return response_header(correlation_id, API_KEY, 0) + body


def _entry_type(response: type) -> type:
    return get_args(response.__dataclass_fields__["api_keys"].type)[0]  # tuple[ApiVersion, ...]


def _api_keys(response: type, ranges: Ranges) -> tuple:
    entry = _entry_type(response)
    return tuple(
        entry(api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(ranges.items())
    )


def _read_ranges(response: type, body: memoryview) -> Ranges:
    """The api_keys array, read by hand (not with kio's reader: see `codec`)."""
    if skip_entity(response, body) != len(body):
        raise FrameError("bytes after the end of the answer")
    entry = _entry_type(response)
    offset = field_offset(response, body, "api_keys")
    count, offset = read_array_length(body, offset, response.__flexible__)
    ranges = {}
    for _ in range(max(count, 0)):
        api_key, low, high = _API_VERSION.unpack_from(body, offset)
        ranges[api_key] = (low, high)
        offset = skip_entity(entry, body, offset)
    return ranges


def check_api_versions_request(api_version: int, body: memoryview) -> None:
    """An ApiVersions request body, read by hand as Kafka reads it (kio's reader is kept
    off bytes from the network): empty up to v2; from v3 the client software's name and
    version, compact strings, then tagged fields, whatever their tags; nothing after."""
    offset = 0
    if api_version >= 3:
        for field in ("client_software_name", "client_software_version"):
            value, offset = read_string(body, offset, compact=True)
            if value is None:
                raise FrameError(f"{field} is null")
        offset = skip_tagged_fields(body, offset)
    if offset != len(body):
        raise FrameError(f"{len(body) - offset} bytes after its end")


def common_ranges(answers: list[Ranges]) -> Ranges:
    """What every broker supports: during a rolling upgrade brokers differ."""
    common = dict(answers[0])
    for answer in answers[1:]:
        for key in list(common):
            if key not in answer:
                del common[key]
                continue
            low, high = max(common[key][0], answer[key][0]), min(common[key][1], answer[key][1])
            if low > high:
                del common[key]
            else:
                common[key] = (low, high)
    return common

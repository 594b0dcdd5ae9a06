"""Which Kafka APIs and versions the proxy can read, and which header each one uses.

The data is the generated `api_table` (kio's schemas); the header rules are Kafka's own
(`ApiMessageType.requestHeaderVersion` / `responseHeaderVersion`): a flexible version
uses request header v2 and response header v1, others v1 and v0. Like Kafka, the header
version depends only on the first flexible version, not on the highest known one, so a
client's ApiVersions request at a version newer than ours still parses.
"""

from __future__ import annotations

from typing import NamedTuple

from proxy.kafka.api_table import API_TABLE
from proxy.kafka.frames import FrameError

API_VERSIONS = 18
# Inter-broker only, absent from kio; kept because its v0 has Kafka's one odd header.
CONTROLLED_SHUTDOWN = 7


class ApiSpec(NamedTuple):
    name: str
    min_version: int
    max_version: int
    first_flexible: int | None  # None: no version is flexible

    def is_flexible(self, version: int) -> bool:
        return self.first_flexible is not None and version >= self.first_flexible


APIS: dict[int, ApiSpec] = {key: ApiSpec(*row) for key, row in API_TABLE.items()}


def spec(api_key: int) -> ApiSpec:
    try:
        return APIS[api_key]
    except KeyError:
        raise FrameError(f"unknown API key {api_key}") from None


def api_name(api_key: int) -> str:
    known = APIS.get(api_key)
    return known.name if known is not None else f"api key {api_key}"


def is_known(api_key: int, api_version: int) -> bool:
    known = APIS.get(api_key)
    return known is not None and known.min_version <= api_version <= known.max_version


def is_flexible(api_key: int, api_version: int) -> bool:
    return spec(api_key).is_flexible(api_version)


def request_header_version(api_key: int, api_version: int) -> int:
    """2 for flexible versions, else 1; ControlledShutdown v0 has header v0 (no client id)."""
    if api_key == CONTROLLED_SHUTDOWN:  # ControlledShutdownRequest.json: flexible from v3
        return 0 if api_version == 0 else 2 if api_version >= 3 else 1
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """1 for flexible versions, else 0.

    ApiVersions responses always use v0: a client that does not yet know which versions
    the broker speaks must be able to read the answer, whatever version it asked for.
    """
    if api_key == API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, api_version) else 0


def supported_ranges() -> dict[int, tuple[int, int]]:
    """api key -> (min, max) version of every API the proxy can read."""
    return {key: (api.min_version, api.max_version) for key, api in APIS.items()}

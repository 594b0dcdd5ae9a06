"""FindCoordinator (api key 10), v0-v6: the coordinator is shown at its proxy address.

Two shapes:
- v0-v3 answer for one key, with node_id, host and port at the top level;
- v4+ (KIP-699) answer for a batch of keys, a `coordinators` array, each with its own.
A coordinator that could not be found comes as node_id -1, host "", port -1 with an
error code; it names no broker and is passed through unchanged.
"""

from __future__ import annotations

from proxy.kafka.codec import load_response_types, response_type
from proxy.kafka.rewrite import Advertise, rewrite_address, rewrite_address_array

API_KEY = 10
FIRST_BATCHED_VERSION = 4
RESPONSES = load_response_types(API_KEY)


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    response = response_type(RESPONSES, API_KEY, api_version)
    if api_version >= FIRST_BATCHED_VERSION:
        return rewrite_address_array(response, "coordinators", body, advertise)
    return rewrite_address(response, body, advertise)

"""Metadata (api key 3), v0-v13: every broker of the answer is shown at its proxy address.

Only the brokers' addresses are rewritten; the topics and partitions that follow them
(the bulk of a large cluster's answer) are copied through as bytes. Node ids are kept,
so leader, replica and controller ids need no change.
"""

from __future__ import annotations

from proxy.protocol.codec import load_response_types, response_type
from proxy.protocol.rewrite import Advertise, rewrite_address_array

API_KEY = 3
RESPONSES = load_response_types(API_KEY)


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    response = response_type(RESPONSES, API_KEY, api_version)
    return rewrite_address_array(response, "brokers", body, advertise)

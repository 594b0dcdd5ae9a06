"""DescribeCluster (api key 60), v0-v2: every broker is shown at its proxy address.

From v1 the request can ask for the controllers instead of the brokers (KIP-919,
`endpoint_type` 2). A broker refuses that (MISMATCHED_ENDPOINT_TYPE, no endpoints), and
the proxy has no listener for controllers anyway: should an upstream list controllers,
the list is emptied rather than leak their addresses or map them to broker listeners.
"""

from __future__ import annotations

from proxy.kafka.codec import load_response_types, response_type
from proxy.kafka.frames import FrameError
from proxy.kafka.rewrite import Advertise, empty_array, rewrite_address_array
from proxy.kafka.schema_walk import field_offset
from proxy.kafka.wire import INT8

API_KEY = 60
ENDPOINT_TYPE_BROKER = 1
RESPONSES = load_response_types(API_KEY)


def rewrite_response(
    api_version: int, body: memoryview, advertise: Advertise
) -> bytes | memoryview:
    response = response_type(RESPONSES, API_KEY, api_version)
    if _endpoint_type(response, body) != ENDPOINT_TYPE_BROKER:
        return empty_array(response, "brokers", body)
    return rewrite_address_array(response, "brokers", body, advertise, id_field="broker_id")


def _endpoint_type(response: type, body: memoryview) -> int:
    if "endpoint_type" not in response.__dataclass_fields__:  # v0: brokers only
        return ENDPOINT_TYPE_BROKER
    offset = field_offset(response, body, "endpoint_type")
    if offset + 1 > len(body):
        raise FrameError(f"malformed DescribeClusterResponse v{response.__version__}: truncated")
    return INT8.unpack_from(body, offset)[0]

"""InitProducerId (api key 22), v0-v6: the two fields of each direction a proxy that
tiers topics reads, to catch up the markers of a fenced transaction before a client
learns of the fencing (proxy/tiered/fencing.py).

Request: `transactional_id` (nullable string, compact from v2) first, then the timeout,
(v3+) the producer id and epoch the client had, (v6) KIP-939's two-phase-commit flags.
Response: `throttle_time_ms, error_code, producer_id, producer_epoch` (fixed sizes in
every version, flexible or not), then (v6) the ongoing transaction's producer id and
epoch. Only the leading fields are read; the rest are not looked at, so a later version
that appends fields reads the same. Both are read by hand (proxy/kafka/wire.py), never
by kio's reader, as every network body is.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.kafka.api_keys import ApiKey
from proxy.kafka.codec import load_types, response_type
from proxy.kafka.frames import malformed
from proxy.kafka.wire import read_int16, read_int32, read_int64, read_string

API_KEY = ApiKey.INIT_PRODUCER_ID
REQUESTS = load_types(API_KEY, "request")


@dataclass(frozen=True, slots=True)
class InitProducerIdAnswer:
    error_code: int
    producer_id: int
    producer_epoch: int


def read_transactional_id(api_version: int, body: memoryview | bytes) -> str | None:
    """The request's transactional id (None: an idempotent producer's request). FrameError
    if the version is not served or the field cannot be read."""
    flexible = response_type(REQUESTS, API_KEY, api_version).__flexible__
    with malformed(f"InitProducerId v{api_version} request"):
        transactional_id, _ = read_string(memoryview(body), 0, flexible)
    return transactional_id


def read_init_producer_id_response(body: memoryview | bytes) -> InitProducerIdAnswer:
    """The answer's error code, producer id and epoch (the same leading fields in every
    version). FrameError if the body is too short to hold them."""
    buf = memoryview(body)
    with malformed("InitProducerId response"):
        _, offset = read_int32(buf, 0)  # throttle_time_ms
        error_code, offset = read_int16(buf, offset)
        producer_id, offset = read_int64(buf, offset)
        producer_epoch, _ = read_int16(buf, offset)
    return InitProducerIdAnswer(error_code, producer_id, producer_epoch)

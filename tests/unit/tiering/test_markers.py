"""Transaction markers: read from, and built byte for byte as, the control batches Kafka
writes. The fixtures are batches a Kafka 4.1 broker wrote (a confluent_kafka
transactional producer: commit, then abort; fetched raw from the leader)."""

from __future__ import annotations

import struct

import crc32c
import pytest

from proxy.records.batches import read_batch_header, validate_batch
from proxy.records.markers import Marker, MarkerError, marker_batch, read_marker
from tests.support.batches import build_batch

# offsets 1 and 3 of the partition (0 and 2 are the transactions' data batches)
KAFKA_COMMIT = bytes.fromhex(
    "00000000000000010000004200000000023d6fd546003000000000000001a21c1c8a76000001a21c1c8a76"
    "00000000000003f10000ffffffff000000012000000008000000010c00000000000000"
)
KAFKA_ABORT = bytes.fromhex(
    "0000000000000003000000420000000002532f8aa0003000000000000001a21c1c8ac1000001a21c1c8ac1"
    "00000000000003f10000ffffffff000000012000000008000000000c00000000000000"
)


def as_tiered(kafka_batch: bytes, base_offset: int) -> bytes:
    """Kafka's batch with the stream's base offset and leader epoch -1 (not under the CRC)."""
    out = bytearray(kafka_batch)
    struct.pack_into(">qii", out, 0, base_offset, len(out) - 12, -1)
    return bytes(out)


@pytest.mark.parametrize(
    ("kafka_batch", "commit", "offset"), [(KAFKA_COMMIT, True, 1), (KAFKA_ABORT, False, 3)]
)
def test_a_marker_kafka_wrote_is_read_and_rebuilt_byte_for_byte(kafka_batch, commit, offset):
    marker = read_marker(kafka_batch)
    header = read_batch_header(kafka_batch)
    assert marker == Marker(1009, 0, 0, commit, header.max_timestamp, offset)
    assert marker.identity == (1009, 0, header.max_timestamp)
    built = marker_batch(marker, 57)
    assert bytes(built) == as_tiered(kafka_batch, 57)
    assert validate_batch(built).base_offset == 57  # the CRC is Kafka's


def test_coordinator_epoch_epochs_and_large_values_round_trip():
    marker = Marker(2**40 + 7, 32_000, 2**31 - 1, False, 1_700_000_000_123, 10**12)
    built = marker_batch(marker, 5)
    header = validate_batch(built)
    assert (header.is_control, header.is_transactional, header.record_count) == (True, True, 1)
    assert (header.partition_leader_epoch, header.base_sequence) == (-1, -1)
    again = read_marker(built)
    assert again == Marker(2**40 + 7, 32_000, 2**31 - 1, False, 1_700_000_000_123, 5)


def test_what_is_not_a_marker_is_a_marker_error():
    with pytest.raises(MarkerError, match="not a transaction marker"):
        read_marker(build_batch([b"v"], producer_id=1, producer_epoch=0, base_sequence=0))
    damaged = bytearray(KAFKA_COMMIT)
    damaged[-3] ^= 1  # the coordinator epoch: under the CRC
    with pytest.raises(MarkerError, match="CRC"):
        read_marker(damaged)
    with pytest.raises(MarkerError, match="type 5"):
        read_marker(_with_control_type(KAFKA_COMMIT, 5))  # another kind of control record


def _with_control_type(batch: bytes, kind: int) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, 61 + 7, kind)  # the key's type, after its version
    struct.pack_into(">I", out, 17, crc32c.crc32c(out[21:]))
    return bytes(out)

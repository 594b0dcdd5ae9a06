"""Fetch (api key 1): the answer to a request `fetch_split.py` read (and split): the
tiered partitions' results merged with upstream's answer; and an answer read whole for the
offload jobs' cluster reader (`read_fetch_response`).

`merge_responses` answers every partition of the request, in its order. The answer is
assembled by hand: upstream's partition entries go in as slices of its answer (records, tags
and all), the tiered record pieces as they are, each byte copied once by one join. kio
takes one bytes value per records field (a join per partition) and copies it into a BytesIO
and out again; it would also need upstream's answer decoded, which `codec` forbids for
network bytes and which drops the tags kio does not know. The client is answered
session_id 0, "no session" (`fetch_split.py`, "Fetch sessions").

A partition upstream left unanswered (a broker throttling a full fetch answers none, KIP-219)
is answered with no error, no records and -1 offsets, which Java ignores; clients fetch it
again. The top-level tags (v16 node endpoints) are upstream's as they came: they name
upstream brokers, so the answer goes through `api01_fetch.rewrite_response`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from proxy.apis.fetch_split import (
    NO_SESSION,
    FetchLayout,
    FetchPartitionView,
    FetchRequestView,
    TieredFetchResult,
    TopicKey,
    answer_layout,
)
from proxy.apis.merge import NO_TAGS, Pieces, merge_partitions
from proxy.kafka.frames import FrameError, malformed
from proxy.kafka.wire import (
    INT32,
    expect_end,
    read_array_length,
    read_count,
    read_int32,
    read_nullable_bytes,
    read_topic_key,
    skip,
    skip_tagged_fields,
    write_array_length,
    write_uvarint,
)

_ABORTED = struct.Struct(">qq")  # producer_id, first_offset
_UNANSWERED = TieredFetchResult(error_code=0)
# (topic, partition), upstream's entry for it -> the pieces of the entry to answer instead,
# or None to answer it as it came
Clamp = Callable[[tuple[TopicKey, int], memoryview], Sequence[bytes | memoryview] | None]


def build_fetch_response(
    api_version: int,
    view: FetchRequestView,
    results: Mapping[tuple[TopicKey, int], TieredFetchResult],
    *,
    throttle_ms: int = 0,
) -> bytes:
    """The answer to a request whose partitions are all tiered."""
    return merge_responses(api_version, view, None, results, throttle_ms=throttle_ms)


def merge_responses(
    api_version: int,
    view: FetchRequestView,
    upstream_body: memoryview | bytes | None,
    results: Mapping[tuple[TopicKey, int], TieredFetchResult],
    *,
    throttle_ms: int = 0,
    clamp: Clamp | None = None,
) -> bytes:
    """The answer body (no header) to `view`: each of its partitions, in its order, from
    `results` (tiered) or else upstream's answer (None: nothing went upstream) or else
    unanswered (see the module docstring); topics named as the request named them.
    `clamp` may replace an upstream partition entry (fetch_clamp: a tiered partition read
    below its cutover is cut there).

    Top-level error 0 and session id 0; the throttle time is the larger of upstream's and
    `throttle_ms`. FrameError if upstream's answer is malformed.
    """
    if api_version != view.api_version:
        raise ValueError(f"a Fetch v{view.api_version} request answered as v{api_version}")
    layout = answer_layout(api_version)
    answered: dict[tuple[TopicKey, int], memoryview] = {}
    tags: bytes | memoryview = NO_TAGS
    if upstream_body is not None:
        with malformed(f"Fetch v{api_version} response"):
            upstream_ms, answered, tags = _read_response(layout, memoryview(upstream_body))
        throttle_ms = max(throttle_ms, upstream_ms)
    flexible = layout.flexible
    out: list[bytes | memoryview] = [INT32.pack(throttle_ms)]
    if layout.session:
        out.append(struct.pack(">hi", 0, NO_SESSION))

    def answer(_: object, p: FetchPartitionView, result: TieredFetchResult | None) -> Pieces:
        return _partition_answer(layout, p.partition, _UNANSWERED if result is None else result)

    out += merge_partitions(view, flexible, results, answered, answer, clamp)
    if flexible:
        out.append(tags)
    return b"".join(out)


def _partition_answer(
    layout: FetchLayout, partition: int, result: TieredFetchResult
) -> list[bytes | memoryview]:
    flexible = layout.flexible
    head = [partition, result.error_code, result.high_watermark, result.last_stable_offset]
    head += [result.log_start_offset] if layout.log_start_offset else []
    if result.error_code:  # Kafka's error answer knows no offset (ReplicaManager's
        head[2:] = [-1] * (len(head) - 2)  # createLogReadResult): OFFSET_OUT_OF_RANGE too
    out: list[bytes | memoryview] = [layout.answer_head.pack(*head)]
    aborted = result.aborted_transactions
    out.append(write_array_length(-1 if aborted is None else len(aborted), flexible))
    for producer_id, first_offset in aborted or ():
        out.append(_ABORTED.pack(producer_id, first_offset))
        out += [NO_TAGS] if flexible else []
    if layout.preferred_read_replica:
        out.append(INT32.pack(result.preferred_read_replica))
    size = sum(len(piece) for piece in result.records)
    if not flexible and size > 0x7FFFFFFF:
        raise ValueError(f"{size} bytes of records for partition {partition} exceed an int32")
    out.append(write_uvarint(size + 1) if flexible else INT32.pack(size))
    out += result.records
    out += [NO_TAGS] if flexible else []
    return out


def _read_response(
    layout: FetchLayout, body: memoryview
) -> tuple[int, dict[tuple[TopicKey, int], memoryview], memoryview]:
    """(throttle_time_ms, {(topic, partition): its whole entry}, the top-level tags)."""
    flexible = layout.flexible
    throttle_ms, offset = read_int32(body, 0)
    if layout.session:
        offset = skip(body, offset, 2 + 4)  # error_code, session_id: not forwarded
    entries: dict[tuple[TopicKey, int], memoryview] = {}
    count, offset = read_count(body, offset, flexible, "responses")
    for _ in range(count):
        topic, offset = read_topic_key(body, offset, layout.topic_id, layout.flexible)
        partition_count, offset = read_count(body, offset, flexible, "partitions")
        for _ in range(partition_count):
            start = offset
            partition, _ = read_int32(body, offset)
            offset = _skip_partition_answer(layout, body, offset)
            entries[topic, partition] = body[start:offset]
        offset = skip_tagged_fields(body, offset) if flexible else offset
    tags_start = offset
    offset = skip_tagged_fields(body, offset) if flexible else offset
    expect_end(body, offset)
    return throttle_ms, entries, body[tags_start:offset]


def _skip_partition_answer(layout: FetchLayout, buf: memoryview, offset: int) -> int:
    """Past one answered partition: fixed fields, aborted transactions, one jump over the
    records (never read), its tagged fields."""
    return _walk_partition_answer(layout, buf, offset, None)[1]


def _walk_partition_answer(
    layout: FetchLayout, buf: memoryview, offset: int, aborted: list[tuple[int, int]] | None
) -> tuple[memoryview | None, int]:
    """(a view of the partition's records or None, the offset past its entry)."""
    flexible = layout.flexible
    offset = skip(buf, offset, layout.answer_head.size)
    start = offset
    count, offset = read_array_length(buf, offset, flexible)
    if count > len(buf) - offset:
        raise FrameError(f"aborted_transactions array of {count} items at byte {start}")
    for _ in range(max(count, 0)):
        end = skip(buf, offset, _ABORTED.size)
        if aborted is not None:  # else skipped: the merge copies the entry whole
            aborted.append(_ABORTED.unpack_from(buf, offset))
        offset = skip_tagged_fields(buf, end) if flexible else end
    if layout.preferred_read_replica:
        offset = skip(buf, offset, 4)
    records, offset = read_nullable_bytes(buf, offset, flexible)
    return records, skip_tagged_fields(buf, offset) if flexible else offset


@dataclass(frozen=True, slots=True)
class FetchPartitionAnswer:
    """One partition of a Fetch answer, as the offload jobs' cluster reader needs it."""

    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int  # -1 before v5
    aborted_transactions: tuple[tuple[int, int], ...]  # (producer_id, first_offset)
    records: memoryview  # a view of the answer, no copy; empty when null


def read_fetch_response(
    api_version: int, body: memoryview | bytes
) -> dict[tuple[TopicKey, int], FetchPartitionAnswer]:
    """Every answered partition of a Fetch answer body (no header), records as views of
    `body`; FrameError if it is malformed. Records are not looked into: a batch the broker
    cut short at the end of `records` is the caller's to handle (`batches.whole_batches`)."""
    layout = answer_layout(api_version)
    with malformed(f"Fetch v{api_version} response"):
        _, entries, _ = _read_response(layout, memoryview(body))
        answers = {}
        for key, entry in entries.items():
            aborted: list[tuple[int, int]] = []
            records, _ = _walk_partition_answer(layout, entry, 0, aborted)
            head = layout.answer_head.unpack_from(entry, 0)
            partition, error_code, high_watermark, last_stable = head[:4]
            answers[key] = FetchPartitionAnswer(
                partition,
                error_code,
                high_watermark,
                last_stable,
                head[4] if layout.log_start_offset else -1,
                tuple(aborted),
                records if records is not None else entry[:0],
            )
    return answers

"""Hypothesis strategies for conformance scenarios: sequences of produce (codecs, batch
sizes, keys, null values, headers, explicit timestamps in and out of order, some past
Kafka's accepted future), delete-records (any offset, mid-batch included, or the high
watermark), one cutover at any point, reads from any offset, timestamp and offset
lookups, OffsetForLeaderEpoch, group commit and resume, and, once tiered, records
written straight to Kafka past the cutover and a refused transaction.

The strategy follows how many records it has produced, so the offsets it picks land in
the log, at its ends and a little past them. Every scenario ends with full reads.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from ops import (
    CLIENTS,
    CODECS,
    HIGH_WATERMARK,
    ZONES,
    Commit,
    DeleteRecords,
    EpochEnd,
    Fetch,
    ListOffsets,
    Produce,
    Rec,
    Resume,
    StrayKafkaWrite,
    StrayTransaction,
    Tier,
)

FUTURE_MS = 2 * 3_600_000  # past Kafka 4's message.timestamp.after.max.ms (1 h)
SPECS = {
    "librdkafka": ("earliest", "latest", "max_timestamp", "timestamp"),
    "aiokafka": ("earliest", "latest", "timestamp"),
    "java": ("earliest", "latest", "max_timestamp", "timestamp", "earliest_local", "latest_tiered"),
}
# op kinds, repeated by weight
KINDS = (
    ("produce",) * 4
    + ("fetch",) * 3
    + ("list",) * 3
    + ("delete",) * 2
    + ("epoch", "commit", "resume", "stray", "produce_tiny")
)

small_bytes = st.binary(min_size=0, max_size=24)
header_keys = st.sampled_from(["a", "b", "trace-id", ""])


@st.composite
def records(
    draw, start_ts: int, least: int = 1, refused: bool = True, ordered: bool | None = None
) -> tuple[Rec, ...]:
    """One batch's records from about `start_ts` on; `refused`: now and then one with a
    timestamp Kafka refuses (the whole batch is then refused)."""
    count = draw(st.one_of(st.integers(least, max(least, 12)), st.integers(max(least, 13), 120)))
    ordered = draw(st.booleans()) if ordered is None else ordered
    ts = start_ts
    out = []
    for n in range(count):
        if ordered:
            ts += draw(st.integers(1, 50))
        else:
            ts = start_ts + draw(st.integers(-5_000, 5_000))
        key = draw(st.one_of(st.none(), st.sampled_from([b"k1", b"k2", b""]), small_bytes))
        value = draw(
            st.one_of(
                st.builds(lambda b, n=n: b"%d:" % n + b, small_bytes),
                st.just(b""),
                st.none(),
                st.builds(lambda b: b * 60, st.binary(min_size=1, max_size=8)),  # compresses
            )
        )
        if key is None and value is None:
            key = b"k"  # aiokafka sends no record with neither
        headers = tuple(
            draw(st.lists(st.tuples(header_keys, st.one_of(st.none(), small_bytes)), max_size=2))
        )
        out.append(Rec(key, value, ts, headers))
    if (
        refused and draw(st.integers(0, 14)) == 14
    ):  # now and then a record Kafka refuses: too far ahead
        n = draw(st.integers(0, count - 1))
        out[n] = Rec(out[n].key, out[n].value, FUTURE_MS, out[n].headers)
    return tuple(out)


@st.composite
def scenarios(draw, tier: str, max_ops: int = 10) -> list:
    """tier: "before" (the tiered topic is tiered before any op) or "midway" (after a
    first produce, at any later point)."""
    n_ops = draw(st.integers(3, max_ops))
    tier_at = 0 if tier == "before" else draw(st.integers(1, n_ops))
    produced, groups, tiered, ts = 0, 0, False, -3_600_000
    stamps: list[int] = []
    ops: list = []
    for i in range(n_ops):
        if i == tier_at:
            ops.append(Tier())
            tiered = True
        kind = "produce" if i == 0 else draw(st.sampled_from(KINDS))
        client = draw(st.sampled_from(CLIENTS))
        zone = draw(st.sampled_from(ZONES))
        offset = st.integers(0, produced + 2)
        if kind in ("produce", "produce_tiny"):
            batch = draw(records(ts))
            if kind == "produce_tiny":
                batch = batch[:1]
            ops.append(Produce(batch, draw(st.sampled_from(CODECS)), client, zone))
            produced += len(batch)
            stamps += [r.ts for r in batch]
            ts = max([ts] + [r.ts for r in batch if r.ts != FUTURE_MS]) + 1000
        elif kind == "fetch":
            ops.append(Fetch(draw(offset), client, zone))
        elif kind == "list":
            ops.append(draw(list_offsets(client, zone, stamps)))
        elif kind == "delete":
            at = draw(st.one_of(offset, st.just(HIGH_WATERMARK)))
            ops.append(DeleteRecords(at, client, zone))
        elif kind == "epoch":
            ops.append(EpochEnd(draw(st.sampled_from([0, 0, -1, 1])), zone))
        elif kind == "commit" or (kind == "resume" and not groups):
            group = draw(st.integers(0, groups))
            groups = max(groups, group + 1)
            ops.append(Commit(group, draw(st.integers(0, produced + 3)), client, zone))
        elif kind == "resume":
            group = draw(st.integers(0, groups - 1))
            reset = draw(st.sampled_from(["earliest", "latest"]))
            ops.append(Resume(group, reset, client, zone))
        elif kind == "stray" and tiered:
            if draw(st.integers(0, 3)):
                ops.append(StrayKafkaWrite(draw(st.integers(1, 5)), draw(st.sampled_from(CODECS))))
            else:
                ops.append(StrayTransaction(zone))
        else:
            ops.append(Fetch(draw(offset), client, zone))
    if not tiered:
        ops.append(Tier())
    # the end state, read in full: every record, both ends, the largest timestamp
    ops.append(Fetch(0, draw(st.sampled_from(CLIENTS)), draw(st.sampled_from(ZONES))))
    for spec in ("earliest", "latest", "max_timestamp"):
        ops.append(ListOffsets(spec, "librdkafka", draw(st.sampled_from(ZONES))))
    if stamps:
        client = draw(st.sampled_from(CLIENTS))
        ops.append(draw(list_offsets(client, "zone-b", stamps, spec="timestamp")))
    if groups:
        ops.append(Resume(0, "earliest", draw(st.sampled_from(CLIENTS)), "zone-a"))
    return ops


SHAPES = (
    "stray_writes",
    "refused_transaction",
    "delete_mid_batch",
    "lookup_in_compressed",
    "log_append_time",
)
TOPIC_CONFIGS = {"log_append_time": {"message.timestamp.type": "LogAppendTime"}}
COMPRESSED = [c for c in CODECS if c != "none"]


@st.composite
def shaped(draw, shape: str) -> list:
    """The issue's bug scenarios, their shape fixed and their data generated (batches,
    codecs, clients, zones, the offsets and timestamps asked): each runs in CI whatever
    the generated scenarios happen to draw."""
    client = st.sampled_from(CLIENTS)
    zone = st.sampled_from(ZONES)
    first = draw(records(-3_600_000, least=2, refused=False))
    second = draw(records(-1_800_000, least=10, refused=False))
    cutover = len(first)
    end = cutover + len(second)
    write = [
        Produce(first, draw(st.sampled_from(COMPRESSED)), draw(client), draw(zone)),
        Tier(),
        Produce(second, draw(st.sampled_from(COMPRESSED)), draw(client), draw(zone)),
    ]
    if shape in ("stray_writes", "refused_transaction"):
        stray = (
            StrayKafkaWrite(draw(st.integers(1, 5)), draw(st.sampled_from(CODECS)))
            if shape == "stray_writes"
            else StrayTransaction(draw(zone))
        )
        return [
            *write,
            stray,
            Fetch(draw(st.integers(0, cutover - 1)), draw(client), draw(zone)),
            ListOffsets("latest", draw(client), draw(zone)),
            ListOffsets("max_timestamp", "java", draw(zone)),
            EpochEnd(0, draw(zone)),
            Produce(draw(records(0, refused=False)), "none", draw(client), draw(zone)),
            Fetch(0, draw(client), draw(zone)),
        ]
    if shape == "delete_mid_batch":
        inside = draw(st.integers(cutover + 1, end - 2))  # inside the tiered batch
        lost, kept = second[inside - cutover - 1], second[inside - cutover]
        return [
            *write,
            DeleteRecords(inside, draw(client), draw(zone)),
            Fetch(inside - 1, draw(client), draw(zone)),
            Fetch(inside, draw(client), draw(zone)),
            ListOffsets("earliest", draw(client), draw(zone)),
            ListOffsets("timestamp", draw(client), draw(zone), lost.ts),
            ListOffsets("timestamp", draw(client), draw(zone), kept.ts),
            ListOffsets("timestamp", draw(client), draw(zone), first[0].ts),
            Commit(0, inside - 1, draw(client), draw(zone)),
            Resume(0, "earliest", draw(client), draw(zone)),
        ]
    if shape == "log_append_time":  # the topics' config says so (TOPIC_CONFIGS)
        return [
            *write,
            Fetch(0, draw(client), draw(zone)),
            Fetch(draw(st.integers(0, end)), draw(client), draw(zone)),
            ListOffsets("latest", draw(client), draw(zone)),
        ]
    assert shape == "lookup_in_compressed", shape
    batch = draw(records(-600_000, least=10, refused=False, ordered=True))
    # records inside the batch: Kafka answers each one's own offset, not the batch's
    asked = [
        batch[n] for n in draw(st.lists(st.integers(1, len(batch) - 1), min_size=2, max_size=4))
    ]
    return [
        Tier(),
        Produce(batch, draw(st.sampled_from(COMPRESSED)), draw(client), draw(zone)),
        *(
            ListOffsets("timestamp", draw(client), draw(zone), r.ts + d)
            for r in asked
            for d in (0, -1)
        ),
        ListOffsets("max_timestamp", draw(st.sampled_from(["java", "librdkafka"])), draw(zone)),
    ]


@st.composite
def list_offsets(
    draw, client: str, zone: str, stamps: list[int], spec: str | None = None
) -> ListOffsets:
    spec = spec or draw(st.sampled_from(SPECS[client]))
    if spec != "timestamp":
        return ListOffsets(spec, client, zone)
    if stamps and draw(st.integers(0, 3)):  # at, just before or just after a record's
        ts = draw(st.sampled_from(stamps)) + draw(st.sampled_from([-1, 0, 0, 1]))
    else:
        ts = draw(st.integers(-4_000_000, 4_000_000))
    return ListOffsets(spec, client, zone, ts)


def conformance_settings(default_examples: int):
    """Bounded and reproducible for CI: derandomized, no example database, no shrinking
    (each example runs against real Kafka). CONFORMANCE_EXAMPLES=n runs more,
    CONFORMANCE_SHRINK=1 shrinks a failure to a smaller scenario."""
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("CONFORMANCE_SHRINK"):
        phases.append(Phase.shrink)
    return settings(
        max_examples=int(os.environ.get("CONFORMANCE_EXAMPLES", default_examples)),
        deadline=None,
        derandomize=True,
        database=None,
        phases=phases,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )

"""Hypothesis strategies for conformance scenarios: sequences of produce (codecs, batch
sizes, keys, null values, headers, explicit timestamps in and out of order, some past
Kafka's accepted future), delete-records (any offset, mid-batch included, or the high
watermark), one cutover at any point, reads from any offset, timestamp and offset
lookups, OffsetForLeaderEpoch, group commit and resume, transactions (a few
transactional ids interleaved on the partition, committed, aborted or left open while
others end, open across the cutover) with read_committed reads and last stable offsets,
and, once tiered, records written straight to Kafka past the cutover.

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
    Tier,
    TxnProduce,
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
    + ("txn",) * 3
    + ("fetch_rc", "list_rc")
)
TXN_IDS = 3  # transactional ids a scenario uses at most
ENDS = ("commit", "abort", "open")

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


class Txns:
    """The scenario's transactions as the strategy draws them: each txn's client, zone
    and codec (fixed at its first op), and which are open."""

    def __init__(self) -> None:
        self.producers: dict[int, tuple[str, str, str]] = {}
        self.open: set[int] = set()

    def op(self, draw, txn: int, batch: tuple[Rec, ...], end: str) -> TxnProduce:
        if txn not in self.producers:
            self.producers[txn] = (
                draw(st.sampled_from(CLIENTS)),
                draw(st.sampled_from(ZONES)),
                draw(st.sampled_from(CODECS)),
            )
        client, zone, codec = self.producers[txn]
        (self.open.add if end == "open" else self.open.discard)(txn)
        return TxnProduce(txn, batch, end, codec, client, zone)

    def end_all(self, draw) -> list[TxnProduce]:
        """Every open transaction ended, committed or aborted."""
        return [
            self.op(draw, txn, (), draw(st.sampled_from(ENDS[:2]))) for txn in sorted(self.open)
        ]


def committed_reads(draw, offset) -> list:
    """A read_committed fetch (its records and the position it reaches) and the last
    stable offset."""
    client = draw(st.sampled_from(CLIENTS))
    return [
        Fetch(draw(offset), client, draw(st.sampled_from(ZONES)), "read_committed"),
        ListOffsets("latest", draw(st.sampled_from(CLIENTS)), draw(st.sampled_from(ZONES)),
                    isolation="read_committed"),
    ]  # fmt: skip


@st.composite
def scenarios(draw, tier: str, max_ops: int = 10) -> list:
    """tier: "before" (the tiered topic is tiered before any op) or "midway" (after a
    first produce, at any later point)."""
    n_ops = draw(st.integers(3, max_ops))
    tier_at = 0 if tier == "before" else draw(st.integers(1, n_ops))
    produced, groups, tiered, ts = 0, 0, False, -3_600_000
    stamps: list[int] = []
    ops: list = []
    txns = Txns()
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
        elif kind == "txn":
            txn = draw(st.integers(0, min(len(txns.producers), TXN_IDS - 1)))
            end = draw(st.sampled_from(ENDS))
            batch = draw(records(ts, refused=False))[: draw(st.integers(0, 30))]
            ops.append(txns.op(draw, txn, batch, end))
            produced += len(batch) + (end != "open")
            ts = max([ts] + [r.ts for r in batch]) + 1000
        elif kind == "fetch_rc":
            ops.append(Fetch(draw(offset), client, zone, "read_committed"))
        elif kind == "list_rc":
            ops.append(ListOffsets("latest", client, zone, isolation="read_committed"))
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
            ops.append(StrayKafkaWrite(draw(st.integers(1, 5)), draw(st.sampled_from(CODECS))))
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
    if txns.producers:  # read_committed, open transactions (if any) ended, and again
        ops += committed_reads(draw, st.just(0))
        if txns.open:
            ops += txns.end_all(draw)
            ops += committed_reads(draw, st.just(0))
    return ops


SHAPES = (
    "stray_writes",
    "transactions",
    "delete_mid_batch",
    "lookup_in_compressed",
    "log_append_time",
    "delete_open_txn",
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
    if shape == "transactions":
        return draw(transactions(first))
    if shape == "stray_writes":
        return [
            *write,
            StrayKafkaWrite(draw(st.integers(1, 5)), draw(st.sampled_from(CODECS))),
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
    if shape == "delete_open_txn":
        # DeleteRecords past the first offset of an open transaction: Kafka's last stable
        # offset is then no lower than the log start (CI found 104 answered for 116), as
        # the base offset of the batch holding the log start: below it when the delete
        # cut the transaction's batch (150 examples found 149 answered for 150)
        txns = Txns()
        opened = draw(records(-1_000_000, least=2, refused=False))[:20]
        inside = end + draw(st.integers(1, len(opened) - 1))
        return [
            *write,
            txns.op(draw, 0, opened, "open"),
            DeleteRecords(draw(st.sampled_from([inside, HIGH_WATERMARK])), draw(client), "zone-a"),
            ListOffsets("latest", draw(client), draw(zone), isolation="read_committed"),
            ListOffsets("earliest", draw(client), draw(zone)),
            Fetch(0, draw(client), draw(zone), "read_committed"),
            *txns.end_all(draw),
            ListOffsets("latest", draw(client), draw(zone), isolation="read_committed"),
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
def transactions(draw, first: tuple[Rec, ...]) -> list:
    """Three transactional ids interleaved on the partition: txn0 opens before the
    cutover and stays open (carried across it) while txn1 commits and txn2 aborts, so the
    last stable offset stays at txn0's first record; then txn0 ends and txn1's producer
    runs its next transaction (same producer id and epoch, the sequence numbers going on:
    its marker must be in the stream before that transaction's first batch)."""
    txns = Txns()
    zone = st.sampled_from(ZONES)
    cutover = len(first)

    def batch(start_ts: int, most: int = 40) -> tuple[Rec, ...]:
        return draw(records(start_ts, refused=False))[:most]

    def reads(ops: list) -> list:
        return [*ops, *committed_reads(draw, st.integers(0, cutover + 30))]

    ops = [
        Produce(
            first, draw(st.sampled_from(COMPRESSED)), draw(st.sampled_from(CLIENTS)), draw(zone)
        ),
        txns.op(draw, 0, batch(-3_000_000), "open"),
        Tier(),
        txns.op(draw, 1, batch(-2_500_000), "commit"),
        txns.op(draw, 0, batch(-2_000_000), "open"),
        txns.op(draw, 2, batch(-1_500_000), "abort"),
    ]
    ops = reads(ops)
    ops.append(Fetch(draw(st.integers(0, cutover)), draw(st.sampled_from(CLIENTS)), draw(zone)))
    ops.append(txns.op(draw, 0, batch(-1_000_000, 5), draw(st.sampled_from(ENDS[:2]))))
    ops.append(txns.op(draw, 1, batch(-500_000), draw(st.sampled_from(ENDS[:2]))))
    ops = reads(ops)
    ops.append(Produce(batch(0, 10), "none", draw(st.sampled_from(CLIENTS)), draw(zone)))
    ops.append(Fetch(0, draw(st.sampled_from(CLIENTS)), draw(zone), "read_committed"))
    ops.append(Fetch(0, draw(st.sampled_from(CLIENTS)), draw(zone)))
    ops.append(ListOffsets("latest", "java", draw(zone), isolation="read_committed"))
    return ops


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
    CONFORMANCE_SHRINK=1 shrinks a failure to a smaller scenario, CONFORMANCE_EXPLORE=1
    draws new scenarios (not derandomized: pytest's `--hypothesis-seed=N` replays one)."""
    phases = [Phase.explicit, Phase.generate]
    if os.environ.get("CONFORMANCE_SHRINK"):
        phases.append(Phase.shrink)
    return settings(
        max_examples=int(os.environ.get("CONFORMANCE_EXAMPLES", default_examples)),
        deadline=None,
        derandomize=not os.environ.get("CONFORMANCE_EXPLORE"),
        database=None,
        phases=phases,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )

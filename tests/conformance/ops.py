"""The operations of a conformance scenario, as plain data.

A scenario is a list of these, run in order against two topics through the same proxy
fleet: a passthrough topic, which Kafka answers, and a tiered topic, which the fleet
answers once `Tier` has run. Every op but the tiered-only ones runs against both with
the same client, and its answers must be equal: Kafka is the oracle.

Timestamps are milliseconds relative to the scenario's base time (a whole second a
little before it starts), so they stay readable in a divergence report and are the same
on both topics. Offsets are absolute: the tiered topic continues Kafka's offsets, so the
shift between the two topics' offsets is zero.
"""

from __future__ import annotations

from dataclasses import dataclass

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
CLIENTS = ("librdkafka", "aiokafka", "java")
ZONES = ("zone-a", "zone-b")
HIGH_WATERMARK = -1  # DeleteRecords' "up to the high watermark"
# Kafka answers a DeleteRecords once every live replica's log start reached the offset:
# on the loaded CI machine a follower held one past a 15 s timeout (2026-12-03, the
# tiered side of a scenario, the passthrough side answered at once), so the clients give
# it a minute; a delete that is refused is answered at once.
DELETE_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    ts: int  # relative to the scenario's base time
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def __repr__(self) -> str:
        headers = f" h={list(self.headers)}" if self.headers else ""
        return f"<{self.key!r}={_short(self.value)} @{self.ts}{headers}>"


@dataclass(frozen=True)
class Produce:
    """One batch per topic: the client sends every record, then flushes."""

    records: tuple[Rec, ...]
    codec: str
    client: str
    zone: str

    def __str__(self) -> str:
        stamps = [r.ts for r in self.records]
        return f"produce {len(self.records)} {self.codec} ts={_span(stamps)} [{self.client}]"


@dataclass(frozen=True)
class DeleteRecords:
    offset: int  # HIGH_WATERMARK: everything
    client: str
    zone: str

    def __str__(self) -> str:
        return f"delete-records before {self.offset} [{self.client}]"


@dataclass(frozen=True)
class Tier:
    """`tierproxy topics tier` on the tiered topic, waited for until its cutover is
    written; on the passthrough topic, nothing."""

    tiered_only = True

    def __str__(self) -> str:
        return "tier (cutover)"


@dataclass(frozen=True)
class TxnProduce:
    """Records in transaction `txn` of the scenario, then `end`: "commit", "abort" or
    "open" (left open: a later TxnProduce of the same `txn` adds to it or ends it).

    Each topic has a transactional producer of its own per `txn` (transactional id
    `<topic>-txn<txn>`), kept for the whole scenario: its next transaction keeps its
    producer id, epoch and sequence numbers, as a client's does. Its client, zone and
    codec are those of the txn's first op (the strategy repeats them). The answer: the
    records' offsets, then how the transaction ended (or the client's error); a
    commit or abort is waited for until its marker is in the log, so that every read
    after it sees the transaction decided, on Kafka and on the tiered topic alike."""

    txn: int
    records: tuple[Rec, ...]
    end: str  # commit, abort, open
    codec: str
    client: str
    zone: str

    def __str__(self) -> str:
        return f"txn{self.txn} produce {len(self.records)} {self.codec}, {self.end} [{self.client}]"


@dataclass(frozen=True)
class Fetch:
    """Every record from `offset` to the high watermark (read_committed: to the last
    stable offset), with auto.offset.reset off; the position reached."""

    offset: int
    client: str
    zone: str
    isolation: str = "read_uncommitted"

    def __str__(self) -> str:
        rc = " read_committed" if self.isolation == "read_committed" else ""
        return f"fetch from {self.offset}{rc} [{self.client} {self.zone}]"


@dataclass(frozen=True)
class ListOffsets:
    spec: str  # earliest, latest, max_timestamp, timestamp, earliest_local, latest_tiered
    client: str
    zone: str
    ts: int | None = None  # for spec "timestamp", relative to the base time
    isolation: str = "read_uncommitted"  # read_committed: latest is the last stable offset

    def __str__(self) -> str:
        at = f" {self.ts}" if self.ts is not None else ""
        rc = " read_committed" if self.isolation == "read_committed" else ""
        return f"list-offsets {self.spec}{at}{rc} [{self.client}]"


@dataclass(frozen=True)
class EpochEnd:
    """OffsetForLeaderEpoch (v4, as a follower-less client asks it) for the partition's
    current leader epoch plus `delta`, on the proxy's address of the leader."""

    delta: int
    zone: str

    def __str__(self) -> str:
        return f"offset-for-leader-epoch current{self.delta:+d} [raw {self.zone}]"


@dataclass(frozen=True)
class Commit:
    """A consumer of group `group` commits `offset`, then reads the commit back."""

    group: int
    offset: int
    client: str
    zone: str

    def __str__(self) -> str:
        return f"commit g{self.group} at {self.offset} [{self.client}]"


@dataclass(frozen=True)
class Resume:
    """A new consumer of group `group` starts where the group left off (or at the reset
    point when nothing valid is committed): the first record it reads, or where it ends."""

    group: int
    reset: str  # earliest, latest
    client: str
    zone: str

    def __str__(self) -> str:
        return f"resume g{self.group} (reset {self.reset}) [{self.client} {self.zone}]"


@dataclass(frozen=True)
class StrayKafkaWrite:
    """Records written straight to a broker of Kafka, past the tiered topic's cutover
    (a producer that bypassed the proxy): no client of the proxy may ever see them."""

    count: int
    codec: str
    tiered_only = True

    def __str__(self) -> str:
        return f"{self.count} records straight to Kafka past the cutover"


@dataclass(frozen=True)
class Restart:
    """Every proxy of the fleet stopped cleanly (SIGTERM) and started again under the
    same name and WAL directory, then waited for until ready (/readyz)."""

    tiered_only = True

    def __str__(self) -> str:
        return "restart the proxies (SIGTERM, start)"


Op = Produce | TxnProduce | DeleteRecords | Tier | Fetch | ListOffsets | EpochEnd | Commit | Resume
StrayOp = StrayKafkaWrite | Restart


def tiered_only(op: object) -> bool:
    return bool(getattr(op, "tiered_only", False))


def _short(value: bytes | None) -> str:
    if value is None:
        return "null"
    return repr(value if len(value) <= 12 else value[:10] + b"..")


def _span(stamps: list[int]) -> str:
    if not stamps:
        return "-"
    ordered = "" if stamps == sorted(stamps) else " (out of order)"
    return f"{min(stamps)}..{max(stamps)}{ordered}"

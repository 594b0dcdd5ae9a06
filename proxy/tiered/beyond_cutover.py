"""What Kafka's own log holds past a tiered partition's cutover, seen in Kafka's answers.

Once a partition is cut over, its data lives in the stream; Kafka's log of it ends at the
cutover. Anything Kafka's log holds past that offset is not the partition's data: every
Kafka-served answer for a tiered partition is clamped at the cutover. Transaction markers
are expected there (Kafka's coordinator writes the marker of every transaction on the
partition into Kafka's log; the marker follower copies each into the stream): they are
not noted. Records a producer wrote straight to a broker, bypassing the proxy, are: a
Fetch answer that cut a data batch is noted here. One counter per answer kind, and one
WARNING per partition and process, so an operator learns that something writes to Kafka
behind the proxy without a log line per Fetch. (ListOffsets and OffsetForLeaderEpoch
answers past the cutover cannot tell a marker from records, so they are clamped without
a note.)

Pure: no asyncio; the read paths call `note` and the metrics collector reads `counts`.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tierproxy.reads")


class BeyondCutover:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # answer kind -> answers clamped
        self._warned: set[tuple[object, int]] = set()

    def note(self, kind: str, topic: object, partition: int, cutover: int, seen: int) -> None:
        """Kafka answered `seen` (an offset or a log end) past `cutover` for this tiered
        partition, in an answer of `kind`; the answer was clamped at the cutover."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        key = (topic, partition)
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(
            "Kafka's log of tiered partition %s-%d holds records past its cutover %d (%s saw"
            " %d): written to a broker directly, not through the proxy; not served"
            " (kafka_beyond_cutover metric counts each clamped answer)",
            topic,
            partition,
            cutover,
            kind,
            seen,
        )

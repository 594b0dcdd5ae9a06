"""The one way a split request's answer is put back together (Fetch, ListOffsets,
DeleteRecords): every partition the request named, in its order, under its topic as the
request named it; each answered by the proxy's result for it, else by upstream's entry as
it came, else as unanswered (each API's module says what that means for its clients).

Pure: no I/O, no asyncio. Upstream's entries go in as slices of its answer, never copied
until the caller's one join.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from proxy.kafka.wire import write_array_length

NO_TAGS = b"\x00"  # an empty tagged-field section

K = TypeVar("K", bound=Hashable)  # a topic key: its name, or its id
R = TypeVar("R")
Pieces = Sequence[bytes | memoryview]


class _Request(Protocol):
    """A request view: its body, and per topic where its name (or id) is (`key_span`),
    and its partitions (each with its `partition` index)."""

    @property
    def body(self) -> memoryview: ...

    @property
    def topics(self) -> Sequence[Any]: ...


def merge_partitions(
    view: _Request,
    flexible: bool,
    results: Mapping[tuple[K, int], R],
    answered: Mapping[tuple[K, int], memoryview],
    answer: Callable[[tuple[K, int], Any, R | None], Pieces],
    upstream: Callable[[tuple[K, int], memoryview], Pieces | None] | None = None,
) -> list[bytes | memoryview]:
    """The topics array of the answer to the request `view`: `results` hold the proxy's
    answers, `answered` upstream's entries, by (topic, partition). `answer(key, partition,
    result)` encodes a partition's entry (the request's view of it) from its result, None
    for one no one answered; `upstream(key, entry)` may replace upstream's entry (None
    keeps it). A partition named twice is answered twice, alike."""
    out: list[bytes | memoryview] = [write_array_length(len(view.topics), flexible)]
    for topic in view.topics:
        out += (view.body[topic.key_span], write_array_length(len(topic.partitions), flexible))
        for p in topic.partitions:
            key = (topic.topic, p.partition)
            result = results.get(key)
            if result is None and key in answered:
                entry = answered[key]
                pieces = None if upstream is None else upstream(key, entry)
                out += (entry,) if pieces is None else pieces
            else:
                out += answer(key, p, result)
        if flexible:
            out.append(NO_TAGS)
    return out

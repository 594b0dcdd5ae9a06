"""What an offload job reads: whole v2 record batches, byte-exact, in offset order.

A batch source (segment files, a live cluster's Fetch answers) is an iterator of
`SourceBatch`; the writer never looks inside a batch beyond its header, so compression,
producer ids, sequences, transaction markers and timestamps reach the object unchanged.
"""

from typing import NamedTuple


class SourceBatch(NamedTuple):
    """One record batch as stored: `data` is the whole batch (header included)."""

    base_offset: int
    last_offset: int
    data: memoryview

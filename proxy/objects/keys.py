"""Object kinds and object keys (docs/object-format.md, "Keys").

A key starts with the last four hex digits of the object id, reversed: object ids grow
one by one, so consecutive objects land on different prefixes and S3 spreads their load
over partitions. Then comes a readable part, the kind and the full id:
``4321/stream-set/0000000000001234``. A key is a pure function of (object id, kind), so an
offload job that runs again writes the very same keys.
"""

from __future__ import annotations

import re
from enum import IntEnum

U64_MAX = (1 << 64) - 1
_SPREAD_DIGITS = 4


class ObjectKind(IntEnum):
    """The object kind, as stored in the footer's kind byte."""

    STREAM_SET = 1  # blocks of many streams: the upload path
    STREAM = 2  # blocks of one stream: compaction, offload jobs

    @property
    def slug(self) -> str:
        return _SLUGS[self]


_SLUGS = {ObjectKind.STREAM_SET: "stream-set", ObjectKind.STREAM: "stream"}
_KINDS_BY_SLUG = {slug: kind for kind, slug in _SLUGS.items()}
_KEY = re.compile(r"([0-9a-f]{4})/(stream-set|stream)/([0-9a-f]{16})")


def object_key(object_id: int, kind: ObjectKind) -> str:
    """The key of an object: ``<reversed last 4 hex digits>/<kind>/<16 hex digits of the id>``."""
    if not 0 <= object_id <= U64_MAX:
        raise ValueError(f"object id {object_id} is not an unsigned 64-bit integer")
    digits = f"{object_id:016x}"
    return f"{digits[::-1][:_SPREAD_DIGITS]}/{ObjectKind(kind).slug}/{digits}"


def parse_object_key(key: str) -> tuple[int, ObjectKind]:
    """The (object id, kind) an `object_key` names; ValueError for anything else."""
    match = _KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"{key!r} is not an object key (<4 hex>/<kind>/<16 hex>)")
    spread, slug, digits = match.groups()
    if spread != digits[::-1][:_SPREAD_DIGITS]:
        raise ValueError(f"{key!r}: prefix {spread!r} does not match object id {digits}")
    return int(digits, 16), _KINDS_BY_SLUG[slug]

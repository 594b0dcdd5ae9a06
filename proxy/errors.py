"""The base of the exceptions the proxy's own subsystems raise.

Each subsystem that raises several errors has its own base under this one (as asyncpg
splits its errors by where they come from): `objects.store.ObjectStoreError`,
`wal.types.WalError`, `metadata.records.MetadataError`, `handoff.writer.S3WalError`. A
caller catches the narrowest base that fits; `TierproxyError` tells the proxy's own
failures from a library's or a bug's. Misuse (a bad argument) still raises ValueError or
TypeError, and bad bytes that are a ValueError stay one.
"""

from __future__ import annotations


class TierproxyError(Exception):
    """A failure of one of the proxy's subsystems (not a bug, not a library's own error)."""


class UnknownTopic(LookupError):
    """Kafka answers UNKNOWN_TOPIC_OR_PARTITION for a topic name: no such topic (deleted,
    or never created). Any other error about a topic is a plain LookupError: it says
    nothing of whether the topic exists."""

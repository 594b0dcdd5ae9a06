"""The uploader's settings and counters (uploader.py; docs/uploader.md). Pure."""

from __future__ import annotations

from dataclasses import dataclass, fields

from proxy.objects.format import FORMAT_VERSION
from proxy.upload.plan import MiB, PlanLimits


@dataclass(frozen=True, slots=True)
class UploaderConfig:
    """Triggers, limits and retry backoff. Errors name the key."""

    upload_bytes: int = 8 * MiB  # WAL bytes not yet uploaded that start an upload
    upload_interval_s: float = 1.0  # the oldest such byte's age that starts one
    min_upload_interval_s: float = 0.1  # between the starts of two uploads
    max_upload_bytes: int = 64 * MiB  # WAL bytes one upload reads at most
    max_object_bytes: int = 16 * MiB  # <= S3Store's multipart_threshold: one PUT each
    stream_object_threshold: int = 16 * MiB
    max_block_bytes: int = 1 * MiB
    poll_interval_s: float = 0.05  # how often the WAL's durable end is looked at
    retry_backoff_s: float = 0.5  # first wait after a failed PUT, doubled each time
    # Kept short: once an outage has filled the WAL, producers wait until a PUT lands, so
    # every second of backoff after the store is back is a second more of stopped produce
    # (at 30 s, a 30 s outage held produce ~24 s longer). A failed round costs a few
    # refused requests; the store retries transient errors itself first.
    retry_backoff_max_s: float = 5.0
    # an object's PUT this old is not committed but uploaded again (tiering.orphan_grace_s / 2)
    max_commit_age_s: float = float("inf")
    object_format_version: int = FORMAT_VERSION  # tiering.object_format_version

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"uploader config error at {spec.name}: {value!r} not positive")
        self.limits  # noqa: B018 - PlanLimits checks the limits and the format version

    @property
    def limits(self) -> PlanLimits:
        return PlanLimits(
            self.max_object_bytes,
            self.stream_object_threshold,
            self.max_block_bytes,
            self.object_format_version,
        )


@dataclass(frozen=True, slots=True)
class UploaderStats:
    uploads: int = 0  # uploads done: put, committed and trimmed
    objects: int = 0
    stream_set_objects: int = 0
    stream_objects: int = 0
    object_bytes: int = 0  # bytes of the objects put
    puts: int = 0  # successful `store.create` calls (one per object)
    put_failures: int = 0  # failed ones, retried
    id_collisions: int = 0  # creates that met another process's object: new ids drawn
    late_puts: int = 0  # rounds of objects too old to commit when PUT, uploaded again
    skipped_entries: int = 0  # already committed before a restart, or stale
    trim_failures: int = 0
    last_upload_seconds: float = 0.0  # read to trim
    max_upload_seconds: float = 0.0
    total_upload_seconds: float = 0.0
    uploaded_to: int = 0  # the WAL offset up to which everything is committed
    backlog_bytes: int = 0  # WAL bytes acknowledged and not yet committed

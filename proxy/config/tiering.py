"""The `tiering` section of the proxy's config (docs/tiering.md, "Configuration").

Absent or `enabled: false`: the proxy passes every topic through. Enabled: it follows the
fleet's metadata topic, takes its share of the shards, runs a local WAL and an uploader
for the partitions it owns, and listens for its peers on `peer_port`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from proxy.config.section import ConfigError, Section
from proxy.objects.format import FORMAT_VERSION, READ_VERSIONS
from proxy.objects.s3config import S3Config
from proxy.upload.plan import MiB

NOTIFY_MODES = ("s3", "direct")
WAL_MODES = ("local", "s3")  # local: files + fsync; s3: the ack waits for a PUT (wal.md)
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_MIN_SESSION_MS = 1000


@dataclass(frozen=True)
class ObjectStoreSettings:
    """Where objects go: a local directory (the embedded default) or an S3 bucket."""

    kind: str = "local"
    directory: Path = Path(".tierproxy/objects")
    s3: S3Config | None = None


@dataclass(frozen=True)
class TieringConfig:
    enabled: bool = False
    metadata_topic: str = "__tierproxy_metadata"
    shard_count: int = 8  # fixed when the metadata topic is created
    shard_group: str = ""  # the consumer group sharing the shards; default <topic>.owners
    session_timeout_ms: int = 10_000  # how long a dead proxy keeps its shards
    # None: a shard whose owner died waits for it (nothing acknowledged is lost); a number:
    # after that many seconds another proxy takes over and what the dead one acknowledged
    # but had not uploaded is lost (like Kafka's unclean leader election)
    unclean_takeover_after_s: float | None = None
    wal_directory: Path = Path(".tierproxy/wal")
    wal_capacity_bytes: int = 1024 * MiB  # then produce waits (backpressure)
    wal_segment_bytes: int = 64 * MiB
    wal_mode: str = "local"  # s3: objects under walog/<fleet.name>/ in the object store
    notify: str = "s3"  # how a proxy that is not the owner hands batches over
    s3wal_max_delay_ms: int = 250
    # seal the S3-WAL object once no batch came for this long (0: off): docs/wal.md
    s3wal_idle_ms: int = 10
    s3wal_max_bytes: int = 8 * MiB
    upload_bytes: int = 8 * MiB
    upload_interval_s: float = 1.0
    peer_bind_host: str = "127.0.0.1"
    peer_port: int = 0  # 0: any free port, told to the fleet in the heartbeat
    # the port peers are told to connect to (0: peer_port's): a port mapping or a TCP proxy
    # in front of the peer listener, as the flaky-network test's toxiproxy
    advertised_peer_port: int = 0
    cutover_hold_ms: int = 30_000  # a produce to a partition being cut over waits this long
    # KIP-890 (Kafka's transaction.partition.verification.enable): the owner asks the
    # coordinator before the first transactional batch of a producer with no transaction
    # open in a tiered partition (docs/tiering.md, "Transactions")
    transaction_partition_verification: bool = True
    # S3 notify: an owner (local WAL) orders a batch from the header its notification
    # carries and answers once a small reference entry is durable, fetching the bytes after
    # (docs/wal.md, "The owner answering from the notification"); false: it reads them first
    owner_takes_references: bool = True
    block_cache_bytes: int = 256 * MiB  # objects' blocks read by any proxy (LRU)
    log_cache_bytes: int = 256 * MiB  # the owned partitions' tail (only uploaded is evicted)
    retention_check_interval_s: float = 60.0  # how often owners apply retention.ms/bytes
    # an object no range uses (compacted, trimmed, untiered) waits this long for readers
    object_delete_grace_s: float = 60.0
    # compaction (docs/tiering.md, "Compaction"): each shard's owner rewrites the ranges
    # small stream set objects hold into stream objects, then deletes what no range uses
    compaction_enabled: bool = True
    compaction_interval_s: float = 300.0  # a pass per owned shard this often
    compaction_trigger_objects: int = 1000  # or as soon as a shard holds this many objects
    compaction_min_objects: int = 8  # fewer small stream set objects: nothing to do
    compaction_small_object_bytes: int = 32 * MiB  # objects below this are rewritten
    stream_object_bytes: int = 64 * MiB  # the stream objects compaction writes, at most
    compaction_max_bytes: int = 1024 * MiB  # source objects one pass reads, at most
    # the log cleaner of compacted topics (docs/tiering.md, "Compacted topics"): how often
    # owners look at their compacted streams (Kafka's log.cleaner.backoff.ms is 15 s), the
    # committed bytes of a stream one clean reads at most, the keys its offset map holds
    log_cleaner_interval_s: float = 15.0
    log_cleaner_max_bytes: int = 1024 * MiB
    log_cleaner_map_keys: int = 250_000
    # bytes per second shared, by priority, by produce (never waits), tail reads, compaction
    # and catch-up reads (docs/tiering.md, "Bandwidth"); 0: unlimited
    bandwidth_bytes_per_s: int = 0
    bandwidth_burst_bytes: int = 0  # 0: one second's worth
    # the orphan sweep (docs/reliability.md, "Orphans"), run by shard 0's owner: objects no
    # shard names go once their PUT is this old; a commit is refused past half of it
    orphan_grace_s: float = 6 * 3600.0
    offload_orphan_grace_s: float = 7 * 86400.0  # a Spark job may PUT long before it commits
    orphan_sweep_interval_s: float = 600.0
    # S3-WAL objects their writer did not delete (it died): far above any notification
    s3wal_retention_s: float = 86400.0
    # the object format version the uploader, compactor and offload jobs write: 1 while a
    # proxy or job of a release before version 2 may read the bucket (operations.md)
    object_format_version: int = FORMAT_VERSION
    object_store: ObjectStoreSettings = field(default_factory=ObjectStoreSettings)

    @property
    def group(self) -> str:
        return self.shard_group or f"{self.metadata_topic}.owners"


def parse_tiering(section: Section, fleet_name: str) -> TieringConfig:
    defaults = TieringConfig()
    enabled = section.boolean("enabled", bool(section.raw))
    wal = section.section("wal")
    safe_name = re.sub(r"[^A-Za-z0-9._-]", "_", fleet_name)
    takeover = section.get("unclean_takeover_after_s")
    config = TieringConfig(
        enabled=enabled,
        metadata_topic=_topic(section, "metadata_topic", defaults.metadata_topic),
        shard_count=section.integer("shard_count", defaults.shard_count, minimum=1),
        shard_group=section.string("shard_group", ""),
        session_timeout_ms=section.integer(
            "session_timeout_ms", defaults.session_timeout_ms, minimum=_MIN_SESSION_MS
        ),
        unclean_takeover_after_s=(
            None
            if takeover is None
            else section.number("unclean_takeover_after_s", 0.0, minimum=0.0)
        ),
        wal_directory=Path(wal.string("directory", f".tierproxy/wal/{safe_name}")),
        wal_capacity_bytes=wal.integer(
            "capacity_bytes", defaults.wal_capacity_bytes, minimum=4 * MiB
        ),
        wal_segment_bytes=wal.integer("segment_bytes", defaults.wal_segment_bytes, minimum=MiB),
        wal_mode=wal.choice("mode", defaults.wal_mode, WAL_MODES),
        notify=section.choice("notify", defaults.notify, NOTIFY_MODES),
        s3wal_max_delay_ms=section.integer("s3wal_max_delay_ms", 250, minimum=1),
        s3wal_idle_ms=section.integer("s3wal_idle_ms", defaults.s3wal_idle_ms, minimum=0),
        s3wal_max_bytes=section.integer("s3wal_max_bytes", defaults.s3wal_max_bytes, minimum=1024),
        upload_bytes=section.integer("upload_bytes", defaults.upload_bytes, minimum=1024),
        upload_interval_s=section.number(
            "upload_interval_s", defaults.upload_interval_s, minimum=0.01
        ),
        peer_bind_host=section.string("peer_bind_host", defaults.peer_bind_host),
        peer_port=section.port("peer_port", 0),
        advertised_peer_port=section.port("advertised_peer_port", 0),
        cutover_hold_ms=section.integer("cutover_hold_ms", defaults.cutover_hold_ms, minimum=100),
        transaction_partition_verification=section.boolean(
            "transaction_partition_verification", defaults.transaction_partition_verification
        ),
        owner_takes_references=section.boolean(
            "owner_takes_references", defaults.owner_takes_references
        ),
        block_cache_bytes=section.integer(
            "block_cache_bytes", defaults.block_cache_bytes, minimum=MiB
        ),
        log_cache_bytes=section.integer("log_cache_bytes", defaults.log_cache_bytes, minimum=MiB),
        retention_check_interval_s=section.number(
            "retention_check_interval_s", defaults.retention_check_interval_s, minimum=0.1
        ),
        object_delete_grace_s=section.number(
            "object_delete_grace_s", defaults.object_delete_grace_s, minimum=0.0
        ),
        bandwidth_bytes_per_s=section.integer(
            "bandwidth_bytes_per_s", defaults.bandwidth_bytes_per_s, minimum=0
        ),
        bandwidth_burst_bytes=section.integer(
            "bandwidth_burst_bytes", defaults.bandwidth_burst_bytes, minimum=0
        ),
        object_format_version=_format_version(section),
        object_store=_object_store(section.section("object_store")),
        **_compaction(section, defaults),
        **_orphans(section, defaults),
    )
    if config.wal_segment_bytes > config.wal_capacity_bytes:
        raise ConfigError(
            wal.key("segment_bytes"),
            f"{config.wal_segment_bytes} exceeds wal.capacity_bytes "
            f"({config.wal_capacity_bytes}): the WAL could not hold one segment",
        )
    wal.reject_unknown()
    section.reject_unknown()
    return config


def _compaction(section: Section, defaults: TieringConfig) -> dict:
    values = {
        "compaction_enabled": section.boolean("compaction_enabled", defaults.compaction_enabled),
        "compaction_interval_s": section.number(
            "compaction_interval_s", defaults.compaction_interval_s, minimum=0.1
        ),
        "compaction_trigger_objects": section.integer(
            "compaction_trigger_objects", defaults.compaction_trigger_objects, minimum=2
        ),
        "compaction_min_objects": section.integer(
            "compaction_min_objects", defaults.compaction_min_objects, minimum=2
        ),
        "compaction_small_object_bytes": section.integer(
            "compaction_small_object_bytes", defaults.compaction_small_object_bytes, minimum=1024
        ),
        "stream_object_bytes": section.integer(
            "stream_object_bytes", defaults.stream_object_bytes, minimum=1024
        ),
        "compaction_max_bytes": section.integer(
            "compaction_max_bytes", defaults.compaction_max_bytes, minimum=1024
        ),
        "log_cleaner_interval_s": section.number(
            "log_cleaner_interval_s", defaults.log_cleaner_interval_s, minimum=0.1
        ),
        "log_cleaner_max_bytes": section.integer(
            "log_cleaner_max_bytes", defaults.log_cleaner_max_bytes, minimum=1024
        ),
        "log_cleaner_map_keys": section.integer(
            "log_cleaner_map_keys", defaults.log_cleaner_map_keys, minimum=1
        ),
    }
    for name, at_least in (
        ("stream_object_bytes", "compaction_small_object_bytes"),
        ("compaction_trigger_objects", "compaction_min_objects"),
    ):
        if values[name] < values[at_least]:
            raise ConfigError(
                section.key(name), f"{values[name]} is below {at_least} ({values[at_least]})"
            )
    return values


def _orphans(section: Section, defaults: TieringConfig) -> dict:
    # seconds at least: an upload commits within half the grace or writes its data again,
    # and one PUT can take that long (hours in production; seconds only in tests)
    values = {
        name: section.number(name, getattr(defaults, name), minimum=minimum)
        for name, minimum in (
            ("orphan_grace_s", 1.0),
            ("offload_orphan_grace_s", 1.0),
            ("orphan_sweep_interval_s", 0.1),
            ("s3wal_retention_s", 1.0),
        )
    }
    offload, grace = values["offload_orphan_grace_s"], values["orphan_grace_s"]
    if offload < grace:
        raise ConfigError(
            section.key("offload_orphan_grace_s"),
            f"{offload} is below orphan_grace_s ({grace}): an offload job's object may wait "
            "longer for its commit than an upload's",
        )
    return values


def _format_version(section: Section) -> int:
    value = section.integer("object_format_version", FORMAT_VERSION, minimum=1)
    if value not in READ_VERSIONS:
        known = " or ".join(map(str, READ_VERSIONS))
        raise ConfigError(
            section.key("object_format_version"),
            f"{value} is not an object format version this release writes ({known})",
        )
    return value


def _topic(section: Section, name: str, default: str) -> str:
    value = section.string(name, default)
    if not _TOPIC.fullmatch(value):
        raise ConfigError(section.key(name), f"{value!r} is not a Kafka topic name")
    return value


def _object_store(section: Section) -> ObjectStoreSettings:
    kind = section.choice("kind", "local", ("local", "s3"))
    directory = Path(section.string("directory", str(ObjectStoreSettings.directory)))
    s3 = None
    if kind == "s3":
        sign_payload = section.optional_boolean("sign_payload")  # names its key itself
        try:
            s3 = S3Config(
                bucket=section.string("bucket", ""),
                endpoint_url=section.get("endpoint_url"),
                region=section.string("region", "us-east-1"),
                access_key_id=section.get("access_key_id"),
                secret_access_key=section.get("secret_access_key"),
                path_style=section.boolean("path_style", False),
                sign_payload=sign_payload,
            )
        except ValueError as exc:  # S3Config names the field: "S3 config bucket='': ..."
            field_name = str(exc).split()[2].split("=")[0] if " config " in str(exc) else "s3"
            raise ConfigError(section.key(field_name), str(exc)) from None
    elif section.get("bucket") is not None:
        raise ConfigError(section.key("bucket"), "set kind: s3 to use a bucket")
    section.reject_unknown()
    return ObjectStoreSettings(kind, directory, s3)

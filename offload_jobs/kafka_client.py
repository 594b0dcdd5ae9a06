"""A blocking Kafka client for the offload jobs, on the proxy's own protocol code.

Just what reading a partition by offset range takes: Metadata (the partition's leader, a
topic's id and partition count), ListOffsets (log start and high watermark) and Fetch
(v12, READ_UNCOMMITTED, no fetch session), each request encoded with kio and each answer
read by hand (`api03_metadata`, `offsets_split`, `fetch_split`), as the proxy reads
upstream's. Plain sockets, no asyncio: it runs inside Spark tasks.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
import uuid
from dataclasses import dataclass, fields

from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64

from proxy.apis.api02_list_offsets import read_list_offsets_response
from proxy.apis.api03_metadata import read_brokers, read_partition_leaders, read_topics
from proxy.apis.fetch_split import FetchPartitionAnswer, read_fetch_response
from proxy.kafka.frames import FrameDecoder, FrameError
from proxy.kafka.headers import response_header_size
from proxy.kafka.messages import encode_request

FETCH_VERSION = 12  # the last to name topics (v13 names them by id); Kafka 4 serves it
METADATA_VERSION = 12
LIST_OFFSETS_VERSION = 7
EARLIEST, LATEST = -2, -1  # ListOffsets timestamps: the log start, the high watermark
READ_UNCOMMITTED = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
# Errors a leader change or a broker restart gives for a while: ask Metadata again, retry.
RETRIABLE = {
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    5: "LEADER_NOT_AVAILABLE",
    6: "NOT_LEADER_OR_FOLLOWER",
    9: "REPLICA_NOT_AVAILABLE",
    13: "NETWORK_EXCEPTION",
    56: "KAFKA_STORAGE_ERROR",
    74: "FENCED_LEADER_EPOCH",
    75: "UNKNOWN_LEADER_EPOCH",
}
log = logging.getLogger("tierproxy.offload")
MAX_FETCH_BYTES_CAP = 256 * 1024 * 1024  # a batch larger than this is not a Kafka batch


class ClusterReadError(Exception):
    """The range cannot be read as asked: names the topic, partition and offset."""

    def __init__(self, topic: str, partition: int, offset: int, what: str) -> None:
        super().__init__(f"{topic}-{partition} at offset {offset}: {what}")
        self.topic, self.partition, self.offset, self.what = topic, partition, offset, what


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    client_id: str = "tierproxy-offload"
    fetch_max_bytes: int = 4 * 1024 * 1024  # per Fetch; doubled for a batch that is larger
    max_wait_ms: int = 100
    timeout_s: float = 30.0  # per request
    retry_for_s: float = 60.0  # how long leader changes and lost connections are retried
    allow_gaps: bool = False  # True for compacted topics: the cleaner leaves offset gaps

    @classmethod
    def of(cls, settings: dict) -> ReaderSettings:
        known = {f.name for f in fields(cls)}
        for key in settings:
            if key not in known:
                raise ValueError(
                    f"cluster reader setting {key!r}: unknown (known: {', '.join(sorted(known))})"
                )
        made = cls(**settings)
        if made.fetch_max_bytes < 1 or made.timeout_s <= 0 or made.retry_for_s < 0:
            raise ValueError(f"cluster reader settings {settings}: sizes and times must be > 0")
        return made


# -- I/O: one connection per broker, blocking ----------------------------------------------


class _Connection:
    def __init__(self, host: str, port: int, timeout_s: float, client_id: str) -> None:
        self.address = f"{host}:{port}"
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        # room for the largest answer asked for, plus its headers
        self._decoder = FrameDecoder(max_frame_bytes=MAX_FETCH_BYTES_CAP + (1 << 20))
        self._client_id = client_id
        self._correlation_id = 0

    def call(self, request) -> memoryview:
        """Send one request; the body of its answer (after the response header)."""
        self._correlation_id += 1
        self._sock.sendall(encode_request(request, self._correlation_id, self._client_id))
        while (frame := self._decoder.next_frame()) is None:
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"{self.address} closed the connection")
            self._decoder.feed(chunk)
        correlation_id = int.from_bytes(frame[:4], "big", signed=True) if len(frame) >= 4 else None
        if correlation_id != self._correlation_id:
            raise FrameError(
                f"{self.address} answered correlation id {correlation_id}, "
                f"expected {self._correlation_id}"
            )
        return frame[response_header_size(request.__api_key__, request.__version__, frame) :]

    def close(self) -> None:
        self._sock.close()


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """host:port[,host:port...]; ValueError naming the bad entry."""
    found = []
    for entry in filter(None, (part.strip() for part in bootstrap.split(","))):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bootstrap {bootstrap!r}: {entry!r} is not host:port")
        found.append((host.strip("[]"), int(port)))
    if not found:
        raise ValueError(f"bootstrap {bootstrap!r}: no host:port")
    return found


class PartitionFetcher:
    """Fetches one partition from its leader, finding the leader again when it moves."""

    def __init__(self, bootstrap: str, topic: str, partition: int, settings: ReaderSettings):
        self.topic, self.partition, self.settings = topic, partition, settings
        self._bootstrap = parse_bootstrap(bootstrap)
        self._leader: _Connection | None = None
        # sent with each request, so that a broker that lost the leadership answers
        # FENCED_LEADER_EPOCH instead of serving as a follower (KIP-392 lets it)
        self._leader_epoch = -1
        self.max_bytes = settings.fetch_max_bytes

    def close(self) -> None:
        if self._leader is not None:
            self._leader.close()
            self._leader = None

    def fetch(self, offset: int) -> FetchPartitionAnswer:
        """The partition's answer at `offset`, retried through leader changes and lost
        connections for `retry_for_s`; ClusterReadError for anything else."""
        return self._retried(offset, lambda: self._fetch_once(offset))

    def log_offsets(self) -> tuple[int, int]:
        """(log start offset, high watermark) as the leader says now."""
        start = self._retried(-1, lambda: self._list_offsets_once(EARLIEST)).offset
        return start, self._retried(-1, lambda: self._list_offsets_once(LATEST)).offset

    def _retried(self, offset: int, call):
        deadline = time.monotonic() + self.settings.retry_for_s
        backoff = 0.1
        while True:
            try:
                answer = call()
                if answer.error_code == 0:
                    return answer
                problem = RETRIABLE.get(answer.error_code)
                if problem is None:
                    raise self._refusal(offset, answer.error_code)
            except (OSError, _NoLeader) as exc:
                problem = str(exc) or type(exc).__name__
            except FrameError as exc:
                raise ClusterReadError(
                    self.topic, self.partition, offset, f"malformed answer: {exc}"
                ) from None
            self.close()
            log.info("%s-%d: %s; finding the leader again", self.topic, self.partition, problem)
            if time.monotonic() + backoff > deadline:
                raise ClusterReadError(
                    self.topic, self.partition, offset,
                    f"still failing after {self.settings.retry_for_s:g} s: {problem}",
                )  # fmt: skip
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _refusal(self, offset: int, error_code: int) -> ClusterReadError:
        if error_code == OFFSET_OUT_OF_RANGE:
            what = "out of range (below the log start or past the log end)"
        else:
            what = f"Kafka answers error code {error_code}"
        return ClusterReadError(self.topic, self.partition, offset, what)

    def _fetch_once(self, offset: int) -> FetchPartitionAnswer:
        if self._leader is None:
            self._leader = self._connect_to_leader()
        body = self._leader.call(self._fetch_request(offset))
        answer = read_fetch_response(FETCH_VERSION, body).get((self.topic, self.partition))
        if answer is None:
            raise FrameError("the answer does not name the partition asked for")
        return answer

    def _list_offsets_once(self, timestamp: int):
        if self._leader is None:
            self._leader = self._connect_to_leader()
        wanted = ListOffsetsPartition(
            partition_index=i32(self.partition), current_leader_epoch=i32(self._leader_epoch),
            timestamp=i64(timestamp),
        )  # fmt: skip
        request = ListOffsetsRequest(
            replica_id=BrokerId(-1),
            isolation_level=i8(READ_UNCOMMITTED),
            topics=(ListOffsetsTopic(name=TopicName(self.topic), partitions=(wanted,)),),
        )
        body = self._leader.call(request)
        answer = read_list_offsets_response(LIST_OFFSETS_VERSION, body)
        found = answer.get((self.topic, self.partition))
        if found is None:
            raise FrameError("the answer does not name the partition asked for")
        return found

    def _fetch_request(self, offset: int) -> FetchRequest:
        wanted = FetchPartition(
            partition=i32(self.partition),
            current_leader_epoch=i32(self._leader_epoch),
            fetch_offset=i64(offset),
            last_fetched_epoch=i32(-1),
            log_start_offset=i64(-1),
            partition_max_bytes=i32(self.max_bytes),
        )
        return FetchRequest(
            cluster_id=None,
            replica_id=BrokerId(-1),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=self.settings.max_wait_ms)),
            min_bytes=i32(1),
            max_bytes=i32(self.max_bytes),
            isolation_level=i8(READ_UNCOMMITTED),
            session_id=i32(0),
            session_epoch=i32(-1),  # sessionless: no slot in the broker's session cache
            topics=(FetchTopic(topic=TopicName(self.topic), partitions=(wanted,)),),
            forgotten_topics_data=(),
            rack_id="",
        )

    def _connect_to_leader(self) -> _Connection:
        settings = self.settings
        body = metadata(self._bootstrap, self.topic, settings)
        brokers = {node: (h, p) for node, h, p, _ in read_brokers(METADATA_VERSION, body)}
        error, leaders = read_partition_leaders(METADATA_VERSION, body, self.topic)
        if error != 0:
            raise _NoLeader(f"Metadata answers error code {error} for the topic")
        if self.partition not in leaders:
            raise ClusterReadError(
                self.topic, self.partition, -1,
                f"no such partition: the topic has {len(leaders)} partitions",
            )  # fmt: skip
        code, leader, epoch = leaders[self.partition]
        if code != 0 or leader not in brokers:
            raise _NoLeader(f"no leader (error code {code}, leader id {leader})")
        self._leader_epoch = epoch
        host, port = brokers[leader]
        return _Connection(host, port, settings.timeout_s, settings.client_id)


def metadata(bootstrap: list[tuple[str, int]], topic: str, settings: ReaderSettings) -> memoryview:
    """A Metadata answer about `topic` from the first bootstrap broker that answers."""
    problems = []
    for host, port in bootstrap:
        try:
            conn = _Connection(host, port, settings.timeout_s, settings.client_id)
            try:
                return conn.call(_metadata_request(topic))
            finally:
                conn.close()
        except OSError as exc:
            problems.append(f"{host}:{port}: {exc}")
    raise _NoLeader(f"no bootstrap broker answers ({'; '.join(problems)})")


def describe_topic(bootstrap: str, topic: str, **settings) -> tuple[uuid.UUID, int]:
    """(topic id, partition count) of a topic; LookupError if Kafka does not know it."""
    options = ReaderSettings.of(settings)
    body = metadata(parse_bootstrap(bootstrap), topic, options)
    for error_code, name, topic_id, partitions in read_topics(METADATA_VERSION, body):
        if name == topic and error_code == 0 and topic_id is not None:
            return topic_id, partitions
        if name == topic and error_code == UNKNOWN_TOPIC_OR_PARTITION:
            raise UnknownTopic(f"topic {topic} does not exist in Kafka")
        if name == topic:
            what = RETRIABLE.get(error_code, "error")
            raise LookupError(f"topic {topic}: Kafka answers {what} (error code {error_code})")
    raise LookupError(f"topic {topic} is not in Kafka's answer")


class UnknownTopic(LookupError):
    """Kafka has no topic of that name."""


def log_offsets(bootstrap: str, topic: str, partition: int, **settings) -> tuple[int, int]:
    """(log start offset, high watermark) of a partition, from its leader."""
    fetcher = PartitionFetcher(bootstrap, topic, partition, ReaderSettings.of(settings))
    try:
        return fetcher.log_offsets()
    finally:
        fetcher.close()


class _NoLeader(Exception):
    """The partition has no reachable leader right now (retried)."""


def _metadata_request(topic: str) -> MetadataRequest:
    return MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=uuid.UUID(int=0), name=TopicName(topic)),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )

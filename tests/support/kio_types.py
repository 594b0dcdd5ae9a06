"""Building kio's message dataclasses for any version of an API in a test: one test body
serves every version, each dataclass taking only the fields its version has."""

from __future__ import annotations

import datetime
import importlib
import uuid
from types import ModuleType

from proxy.kafka.codec import load_types

MS = datetime.timedelta(milliseconds=1)  # kio's unit for *_ms fields


def served(api_key: int) -> tuple[dict[int, type], dict[int, type], list[int]]:
    """kio's request and response classes of an API by version, and those versions in
    order: every version the proxy serves (proxy/kafka/versions.py), one test body each."""
    requests = load_types(api_key, "request")
    return requests, load_types(api_key, "response"), sorted(requests)


def mod(types: dict, version: int) -> ModuleType:
    """The kio module of `types[version]` (its nested dataclasses live there)."""
    return importlib.import_module(types[version].__module__)


def only_fields(cls, **fields):
    """cls built from the fields it has: the version decides which of `fields` exist."""
    return cls(
        **{name: value for name, value in fields.items() if name in cls.__dataclass_fields__}
    )


def topic_key(version: int, name: str) -> str | uuid.UUID:
    """A topic as Produce and Fetch name it: by name, by id from v13 (an id derived from
    the name, so a test names the same topic alike in every version)."""
    return uuid.uuid5(uuid.NAMESPACE_DNS, name) if version >= 13 else name


def produce_request(version: int, layout, *, transactional_id=None, acks=-1, timeout_ms=1500):
    """kio's ProduceRequest of `version`: `layout` maps a topic's name to its
    [(partition, records)] (records None: a null records field)."""
    m = mod(load_types(0, "request"), version)
    topics = tuple(
        m.TopicProduceData(
            **{"topic_id" if version >= 13 else "name": topic_key(version, name)},
            partition_data=tuple(
                m.PartitionProduceData(index=index, records=records)
                for index, records in partitions
            ),
        )
        for name, partitions in layout.items()
    )
    return m.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=timeout_ms),
        topic_data=topics,
    )

"""DeleteTopics through a proxy that tiers topics: forwarded whole; once Kafka answered,
every tiered topic it deleted is dropped from the fleet before the client has the answer
(docs/tiering.md, "Deleting a tiered topic").

Kafka deletes a topic's log with the topic: a client that deleted a tiered topic and
creates it again under its name (a test suite's set-up, an application reset) writes to
an empty topic, and a Produce naming it by name must reach that new topic, not the old
topic's stream, which still holds the name in the fleet's metadata until the owner of its
topic shard marks it DELETED (`CutoverLoop.topic_deleted`, asked here over the peer
protocol when that owner is another proxy). So the answer waits for that mark: from then
on the name is passthrough on every proxy that has read it, and the old streams are
dropped by their owners, their objects by the garbage collector. Every proxy forgets the
topic's configs too (kept by name: `TopicConfigs.changed`, over the peer protocol as for
AlterConfigs), so that a topic created again under the name and tiered has its own.

A mark that fails (the topic shard with no live owner, a peer away) is logged and the
client gets Kafka's answer all the same: the owner's own check of Kafka finds the
deletion within seconds (cutover.py, `TOPICS_CHECK_S`). Answering an error instead
would make the client retry a delete Kafka has done (it then answers
UNKNOWN_TOPIC_OR_PARTITION).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Protocol

from proxy.apis.api20_delete_topics import read_delete_topics_response
from proxy.kafka.frames import FrameError
from proxy.metadata.topic_index import TieredTopic, TopicIndex
from proxy.tiered.outcome import pass_outcome

log = logging.getLogger("tierproxy.tiering")


class TopicDeletesHost(Protocol):
    """What DeleteTopics needs of the tiered service (service.py)."""

    @property
    def topics(self) -> TopicIndex: ...

    async def topic_deleted(self, topic: str, topic_id: uuid.UUID) -> tuple[int, str]:
        """The tiered topic marked DELETED by the owner of its topic shard."""
        ...

    async def configs_changed(self, topics: list[str] | None) -> None:
        """These topics' configs forgotten by every proxy (config_changes.py)."""
        ...


@dataclass(slots=True, eq=False)
class DeleteTopicsPlan:
    """The request goes upstream whole; once Kafka answered, the tiered topics it deleted
    are marked (`upstream_answered`), and `local` is done then. The answer is Kafka's."""

    upstream_frame: tuple[bytes | memoryview, ...]
    host: TopicDeletesHost
    local: asyncio.Future[None]
    passthrough_topics: tuple[str, ...] = ()

    def upstream_answered(self, api_version: int, upstream: memoryview) -> None:
        try:
            results = read_delete_topics_response(api_version, upstream)
        except FrameError:  # passed on as Kafka gave it: the client judges it
            self.local.set_result(None)
            return
        deleted: list[TieredTopic] = []
        for result in results:
            if result.error_code != 0:
                continue
            tiered = self._tiered(result.name, result.topic_id)
            if tiered is not None:
                deleted.append(tiered)
        if not deleted:
            self.local.set_result(None)
            return
        task = asyncio.ensure_future(self._mark(deleted))
        task.add_done_callback(lambda done: pass_outcome(done, self.local))

    def _tiered(self, name: str | None, topic_id: uuid.UUID | None) -> TieredTopic | None:
        """The tiered topic a result names: by its id when the answer gives one (v6),
        else by its name."""
        topics = self.host.topics
        if topic_id is not None:
            return topics.topic(topic_id)
        return None if name is None else topics.topic(name)

    async def _mark(self, deleted: list[TieredTopic]) -> None:
        # the configs are kept by name: a topic created again under it has its own
        marks = asyncio.gather(
            *(self.host.topic_deleted(t.name, t.topic_id) for t in deleted),
            return_exceptions=True,
        )
        forget = self.host.configs_changed([t.name for t in deleted])  # logs its failures
        answers, _ = await asyncio.gather(marks, forget)
        for topic, answer in zip(deleted, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer  # a cancel: the connection is going away
                failure = f"{type(answer).__name__}: {answer}"
            elif answer[0] != 0:
                failure = answer[1]
            else:
                continue
            log.warning(
                "DeleteTopics of tiered topic %s answered before the fleet dropped it (%s); "
                "its owner's own check of Kafka drops it within seconds",
                topic.name,
                failure,
            )

    def merge(self, api_version: int, upstream: memoryview | None, local: None) -> bytes:
        assert upstream is not None
        return bytes(upstream)

    def failed(self, error: BaseException) -> None:
        return None  # a bug (logged by the connection): Kafka's answer as it came


def plan_delete_topics(
    tiering: TopicDeletesHost, frame: tuple[bytes | memoryview, ...]
) -> DeleteTopicsPlan | None:
    """The plan for one DeleteTopics (`frame`: the request as it came); None to forward
    it with nothing after (no topic is tiered). The request itself is not read: which
    tiered topics it deleted is in Kafka's answer."""
    if not tiering.topics.any():
        return None
    local: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    return DeleteTopicsPlan(frame, tiering, local)

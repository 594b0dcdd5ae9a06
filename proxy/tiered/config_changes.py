"""AlterConfigs and IncrementalAlterConfigs through a proxy that tiers topics: forwarded
whole; once Kafka answered, a tiered topic whose configs it changed has them read again
by every proxy before the client has the answer (docs/tiering.md, "A topic's configs
changed").

A tiered topic's produce rules (`message.timestamp.type`, `max.message.bytes`, the
timestamp bounds) are Kafka's topic configs, which each proxy keeps up to a minute
(`topic_configs.py`): an application that changes one and produces at once would see
the old rule where Kafka's leader applies the new one. So each proxy forgets the topic's
configs (`TopicConfigs.changed`; every topic's when a broker's default changed, which a
topic without its own value takes), this one and every live member at
`CONFIGS_PROTOCOL` or later, told over the peer protocol (admin op `configs`).

The answer is Kafka's whatever happens here: a member not told within CONFIGS_WAIT_S
(away, or an older release) reads the configs again within a minute, as before; that is
logged. Resources Kafka refused change nothing. The request is not read, so one that
only validated (`validate_only`) makes the proxies read the configs again all the same,
and so does any change of a broker's configs (whichever key: the answer does not say),
every topic's then: one DescribeConfigs per topic on each proxy's next produce to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from proxy.apis.api33_alter_configs import BROKER_RESOURCE, TOPIC_RESOURCE, AlteredResource
from proxy.kafka.frames import FrameError
from proxy.metadata.topic_index import TopicIndex
from proxy.tiered.outcome import pass_outcome

log = logging.getLogger("tierproxy.tiering")


class ConfigChangesHost(Protocol):
    """What a config change needs of the tiered service (service.py)."""

    @property
    def topics(self) -> TopicIndex: ...

    async def configs_changed(self, topics: list[str] | None) -> None:
        """These tiered topics' configs (None: every topic's) read again by every proxy."""
        ...


Reader = Callable[[int, memoryview], list[AlteredResource]]


def changed_topics(host: ConfigChangesHost, results: list[AlteredResource]) -> list[str] | None:
    """The tiered topics whose configs Kafka changed ([]: none; None: a broker's, so
    every topic's that takes the broker's default)."""
    changed: list[str] = []
    for result in results:
        if result.error_code != 0:
            continue
        if result.resource_type == BROKER_RESOURCE:
            return None
        if result.resource_type == TOPIC_RESOURCE and host.topics.topic(result.name) is not None:
            changed.append(result.name)
    return changed


@dataclass(slots=True, eq=False)
class ConfigChangesPlan:
    """The request goes upstream whole; once Kafka answered, the tiered topics whose
    configs changed are read again (`upstream_answered`), and `local` is done then. The
    answer is Kafka's."""

    upstream_frame: tuple[bytes | memoryview, ...]
    host: ConfigChangesHost
    local: asyncio.Future[None]
    read: Reader
    passthrough_topics: tuple[str, ...] = ()

    def upstream_answered(self, api_version: int, upstream: memoryview) -> None:
        try:
            changed = changed_topics(self.host, self.read(api_version, upstream))
        except FrameError:  # passed on as Kafka gave it: the client judges it
            self.local.set_result(None)
            return
        if changed == []:
            self.local.set_result(None)
            return
        task = asyncio.ensure_future(self.host.configs_changed(changed))
        task.add_done_callback(lambda done: pass_outcome(done, self.local))

    def merge(self, api_version: int, upstream: memoryview | None, local: None) -> bytes:
        assert upstream is not None
        return bytes(upstream)

    def failed(self, error: BaseException) -> None:
        return None  # a bug (logged by the connection): Kafka's answer as it came


def plan_config_changes(
    tiering: ConfigChangesHost, frame: tuple[bytes | memoryview, ...], read: Reader
) -> ConfigChangesPlan | None:
    """The plan for one AlterConfigs or IncrementalAlterConfigs (`frame`: the request as
    it came; `read`: its answer's reader); None to forward it with nothing after (no
    topic is tiered)."""
    if not tiering.topics.any():
        return None
    local: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    return ConfigChangesPlan(frame, tiering, local, read)

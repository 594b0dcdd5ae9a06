"""A tiered topic's configs changed through the fleet (`TopicConfigs.changed`,
proxy/tiered/topic_configs.py): its next produce reads them from Kafka first, a read under
way when the change came does not keep what it read, and they are read again a little
later (a KRaft broker may describe them before it applied the change).

The admin client is a stand-in answering DescribeConfigs from a dict: pure scheduling.
The real path (AlterConfigs through one proxy, a produce through another, a real Kafka)
is `tests/integration/tiering/test_tiered_config_change.py`.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaConnectionError

from proxy.peer.codec import CONFIGS_PROTOCOL
from proxy.peer.messages import AdminRequest
from proxy.tiered import topic_configs
from proxy.tiered.service import TieringService
from proxy.tiered.topic_configs import TopicConfigs


class _Admin:
    """DescribeConfigs answered from `values`; a read can be held until `release`."""

    def __init__(self) -> None:
        self.values = {"message.timestamp.type": "CreateTime"}
        self.reads = 0
        self.hold: asyncio.Event | None = None

    async def describe_configs(self, resources):
        self.reads += 1
        values = dict(self.values)  # what the broker holds when the read reaches it
        hold, self.hold = self.hold, None  # this read only
        if hold is not None:
            await hold.wait()
        entries = [(k, v) for k, v in values.items()]
        resources = [(0, None, 2, r.name, entries) for r in resources]
        return [SimpleNamespace(resources=resources)]


def _configs(admin: _Admin) -> TopicConfigs:
    configs = TopicConfigs({})

    async def client():
        return admin

    configs._admin_client = client  # type: ignore[method-assign]
    return configs


async def test_a_change_is_read_before_the_next_produce_not_a_minute_later():
    admin = _Admin()
    configs = _configs(admin)
    assert not (await configs.produce_rules("t")).log_append_time
    admin.values["message.timestamp.type"] = "LogAppendTime"  # changed in Kafka
    assert not (await configs.produce_rules("t")).log_append_time  # cached: a minute
    configs.changed(["t"])
    assert (await configs.produce_rules("t")).log_append_time
    assert admin.reads == 2
    await configs.close()


async def test_a_read_under_way_when_the_change_came_is_not_kept(monkeypatch):
    admin = _Admin()
    configs = _configs(admin)
    monkeypatch.setattr(configs, "max_age_s", 0.0)  # every produce refreshes in the back
    await configs.produce_rules("t")
    old_read = admin.hold = asyncio.Event()
    await configs.produce_rules("t")  # a refresh starts, reading the old values
    await asyncio.sleep(0)
    assert admin.reads == 2  # under way, holding the old values
    admin.values["message.timestamp.type"] = "LogAppendTime"
    configs.changed(["t"])
    monkeypatch.setattr(configs, "max_age_s", 60.0)
    new_read = await asyncio.wait_for(configs.produce_rules("t"), 2)  # not the old read's
    assert new_read is not None and new_read.log_append_time
    old_read.set()  # the old read ends last
    await asyncio.sleep(0.01)
    assert (await configs.produce_rules("t")).log_append_time
    assert admin.reads == 3
    await configs.close()


async def test_a_first_read_a_change_overtook_is_read_again_not_answered_without_rules():
    """A produce waits for the topic's first read when the change comes: that read is not
    kept, so the produce reads again (it got no rules: KAFKA_STORAGE_ERROR)."""
    admin = _Admin()
    configs = _configs(admin)
    old_read = admin.hold = asyncio.Event()
    waiting = asyncio.create_task(configs.produce_rules("t"))
    await asyncio.sleep(0.01)
    assert admin.reads == 1
    admin.values["message.timestamp.type"] = "LogAppendTime"
    configs.changed(["t"])
    old_read.set()
    rules = await asyncio.wait_for(waiting, 2)
    assert rules is not None and rules.log_append_time
    assert admin.reads == 2
    await configs.close()


async def test_retention_and_deletes_reading_during_a_change_get_the_topic_read_again():
    """`get` (retention, DeleteRecords' policy check) whose read a change overtook reads
    again: a topic left out would let a DeleteRecords past a compacted topic's check."""
    admin = _Admin()
    admin.values["cleanup.policy"] = "compact"
    configs = _configs(admin)
    old_read = admin.hold = asyncio.Event()
    reading = asyncio.create_task(configs.get(["t"]))
    await asyncio.sleep(0.01)
    configs.changed(["t"])
    old_read.set()
    got = await asyncio.wait_for(reading, 2)
    assert list(got) == ["t"] and not got["t"].delete
    assert admin.reads == 2
    await configs.close()


async def test_close_ends_the_reads_a_change_let_go_and_later_changes_do_nothing():
    admin = _Admin()
    configs = _configs(admin)
    admin.hold = asyncio.Event()  # never set: the read hangs
    configs._read_soon("t")
    await asyncio.sleep(0.01)
    configs.changed(["t"])  # lets the read go
    (held,) = configs._others
    admin.hold = asyncio.Event()
    waiting = asyncio.create_task(configs.produce_rules("u"))  # its first read, shared
    await asyncio.sleep(0.01)
    await asyncio.wait_for(configs.close(), 2)
    assert held.cancelled()
    assert await waiting is None  # no rules (retriable), not the shared read's cancel
    configs.changed(["t"])  # after close: no timer left behind
    assert not configs._rereads
    calls = admin.reads
    assert await configs.produce_rules("t") is None  # a produce after close reads nothing
    assert admin.reads == calls and configs._admin is None


async def test_a_brokers_default_changed_forgets_every_topic(monkeypatch):
    admin = _Admin()
    configs = _configs(admin)
    await configs.produce_rules("a")
    await configs.produce_rules("b")
    admin.values["message.timestamp.type"] = "LogAppendTime"
    configs.changed(None)
    assert (await configs.produce_rules("a")).log_append_time
    assert (await configs.produce_rules("b")).log_append_time
    await configs.close()


async def test_the_configs_are_read_again_after_a_change(monkeypatch):
    """The first read after the change reached a broker that had not applied it yet:
    the read a little later finds it."""
    monkeypatch.setattr(topic_configs, "CHANGE_REREADS_S", (0.05, 0.1))
    admin = _Admin()
    configs = _configs(admin)
    configs.changed(["t"])
    assert not (await configs.produce_rules("t")).log_append_time  # the broker is behind
    admin.values["message.timestamp.type"] = "LogAppendTime"  # now it applied it
    for _ in range(100):
        await asyncio.sleep(0.01)
        if (await configs.produce_rules("t")).log_append_time:
            break
    assert (await configs.produce_rules("t")).log_append_time
    assert admin.reads >= 2
    await configs.close()


async def test_the_change_is_told_to_every_live_member_that_reads_the_admin_op(caplog):
    """`TieringService.configs_changed`: forgotten here, and told to each live member at
    CONFIGS_PROTOCOL or later; an older one is not asked (it reads them within a minute),
    one that fails to answer is logged. A member told runs `on_peer_admin`."""
    forgotten: list[list[str] | None] = []
    told: list[tuple[tuple[str, int], str, str]] = []
    levels = {"new": CONFIGS_PROTOCOL, "old": CONFIGS_PROTOCOL - 1, "away": CONFIGS_PROTOCOL}

    async def admin(address, op, topic, topic_id, *, timeout_s=None):
        told.append((address, op, topic))
        if address[0] == "away":
            raise TimeoutError()
        return 0, "read again"

    service = SimpleNamespace(
        topic_configs=SimpleNamespace(changed=forgotten.append),
        live_peers=lambda: list(levels),
        peer_protocol=levels.__getitem__,
        peer_address=lambda member: (member, 9000),
        peers=SimpleNamespace(admin=admin),
    )
    service._tell_configs = functools.partial(TieringService._tell_configs, service)
    await TieringService.configs_changed(service, ["t", "u"])
    assert forgotten == [["t", "u"]]
    assert sorted(told) == [
        (("away", 9000), "configs", "t"),
        (("away", 9000), "configs", "u"),
        (("new", 9000), "configs", "t"),
        (("new", 9000), "configs", "u"),
    ]
    assert "away not told the configs of t changed" in caplog.text
    forgotten.clear(), told.clear()
    await TieringService.configs_changed(service, None)  # a broker's default
    assert forgotten == [None] and (("new", 9000), "configs", "") in told

    request = AdminRequest(1, "configs", "t", uuid.UUID(int=0))
    assert (await TieringService.on_peer_admin(service, request))[0] == 0
    assert forgotten[-1] == ["t"]
    await TieringService.on_peer_admin(service, AdminRequest(1, "configs", "", uuid.UUID(int=0)))
    assert forgotten[-1] is None


async def test_no_admin_client_is_made_after_close():
    """A DeleteRecords' trim below a log start (`delete_below`) or a read after close
    opens no admin client that nothing would close."""
    configs = TopicConfigs({"bootstrap_servers": "127.0.0.1:1"})
    await configs.close()
    with pytest.raises(KafkaConnectionError, match="closed"):
        await configs._admin_client()
    assert configs._admin is None

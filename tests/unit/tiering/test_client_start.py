"""start_client: a cancelled start ends first (so the client's stop closes what it opened),
within a bound. A fake client with a scripted start: pure asyncio logic."""

from __future__ import annotations

import asyncio

import pytest

from proxy.metadata.client_start import start_client


class ScriptedClient:
    def __init__(self, takes_s: float, fails: bool = False) -> None:
        self.takes_s, self.fails = takes_s, fails
        self.started = self.cancelled = False

    async def start(self) -> None:
        try:
            await asyncio.sleep(self.takes_s)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.fails:
            raise ConnectionError("bootstrap failed")
        self.started = True


async def test_a_start_not_cancelled_is_just_a_start():
    client = ScriptedClient(0.01)
    await start_client(client)
    assert client.started and not client.cancelled


@pytest.mark.parametrize("fails", [False, True], ids=["starts", "fails"])
async def test_a_cancelled_start_ends_first_then_the_cancellation_is_raised(fails):
    client = ScriptedClient(0.2, fails=fails)
    task = asyncio.ensure_future(start_client(client, settle_s=5))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.started is not fails and not client.cancelled


async def test_a_start_that_does_not_end_within_the_bound_is_cancelled():
    client = ScriptedClient(60)
    task = asyncio.ensure_future(start_client(client, settle_s=0.1))
    await asyncio.sleep(0.05)
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0)
    assert client.cancelled and not client.started


async def test_a_failed_start_raises_its_error():
    with pytest.raises(ConnectionError, match="bootstrap failed"):
        await start_client(ScriptedClient(0.01, fails=True))


def test_every_aiokafka_module_that_asks_for_metadata_asks_without_creating_topics():
    """The guard replaces aiokafka's MetadataRequest in the modules that build one. An
    aiokafka release that builds its metadata requests in another module would bring the
    re-creation of deleted topics back unnoticed: every module of the installed aiokafka
    that builds a MetadataRequest in its source must hold the guard's class."""
    import contextvars
    import importlib
    import inspect
    import pkgutil
    import re

    import aiokafka

    from proxy.metadata import client_start

    guard = client_start._MetadataRequest  # noqa: SLF001
    naming = []
    for info in pkgutil.walk_packages(aiokafka.__path__, "aiokafka."):
        if info.name == "aiokafka.protocol.metadata":  # where it is defined
            continue
        module = importlib.import_module(info.name)
        try:
            source = inspect.getsource(module)
        except OSError:  # compiled: no source to read
            continue
        if re.search(r"MetadataRequest(_v\d+)?\(", source):
            naming.append(info.name)
            assert vars(module).get("MetadataRequest") is guard, info.name
    assert sorted(naming) == ["aiokafka.admin.client", "aiokafka.client"]

    def built(allow: bool) -> bool:
        return guard(["t"], allow)._allow_auto_topic_creation  # noqa: SLF001

    assert built(True)  # a user's client, in the same process: as aiokafka does
    in_proxy = contextvars.copy_context()
    in_proxy.run(client_start.forbid_topic_auto_creation)
    assert in_proxy.run(built, True) is False
    assert built(True)  # the context of the proxy's tasks only

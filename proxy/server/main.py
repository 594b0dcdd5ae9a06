"""Running a proxy until it is told to stop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import uvloop

from proxy import logs
from proxy.config import ProxyConfig
from proxy.server.app import Proxy


async def serve(config: ProxyConfig, on_ready: Callable[[Proxy], None] | None = None) -> None:
    proxy = Proxy(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await proxy.start()  # inside: a start that fails leaves nothing running
        if on_ready is not None:
            on_ready(proxy)
        await stop.wait()
    finally:
        await proxy.stop()


def run(config: ProxyConfig, on_ready: Callable[[Proxy], None] | None = None) -> None:
    logs.configure_logging(config.log_level, config.logging.format, config.logging.access)
    uvloop.run(serve(config, on_ready))

"""The asyncio side of the proxy: listeners, client connections, upstream connections.

Protocol decisions live in proxy.protocol and proxy.apis; these modules only move bytes,
apply backpressure and close what must be closed.
"""

"""The asyncio side of the proxy: listeners, client connections, upstream connections.

Protocol decisions live in proxy.kafka, proxy.apis and the pure modules of each subsystem;
these modules only move bytes, apply backpressure and close what must be closed.
"""

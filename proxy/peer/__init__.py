"""The proxy-to-proxy ("peer") protocol: pure messages and frames, and its asyncio server and
clients.
"""

"""The Kafka wire protocol as pure functions: bytes in, decisions and bytes out.

Nothing here touches a socket or imports asyncio, so the same code serves the proxy's
connections, the offload jobs and the tests.

- `frames`: size-prefixed framing (`FrameDecoder`, `frame`) and `FrameError`, the one
  exception every decode error raises.
- `apis`: the table of API keys and versions and the header version rules.
- `headers`: request and response headers, and the acks of a Produce request.
- `rewrite`: broker addresses replaced inside a response body, all else copied through.
- `schema_walk`: stepping over a message laid out per a kio schema, building nothing.
- `codec`: kio's classes per version; encoding with kio (and why not decoding).
- `wire`: the primitive readers and writers the rest is built on.
"""

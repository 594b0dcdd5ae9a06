"""A metadata shard's owner for unit tests of the upkeep runners."""

from __future__ import annotations

from proxy.metadata.codec import encode
from proxy.metadata.state import MetadataState


class Owner:
    """A shard's owner: judges each record after the accepted ones before it, applies the
    accepted ones, returns the verdicts (what ShardOwner.write returns once read back)."""

    def __init__(self, state: MetadataState) -> None:
        self.state, self.epoch, self.owning = state, 1, True
        self.fail: Exception | None = None
        self.before_write = None
        self.written: list = []

    async def write(self, records):
        if self.before_write is not None:
            self.before_write()
        if self.fail is not None:
            raise self.fail
        verdicts = []
        for record in records:
            verdict = self.state.check(record)
            if verdict.accepted:
                self.state.apply(*encode(record), self.state.next_offset)
                self.written.append(record)
            verdicts.append(verdict)
        return verdicts

"""Transaction markers of tiered partitions (docs/tiering.md, "Transactions"): the
follower that reads Kafka's own log of each partition owned here and appends the markers
Kafka's coordinator wrote to the stream; its pure decisions (follow.py) beside the
asyncio runner (follower.py).
"""

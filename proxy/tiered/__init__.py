"""The tiered data plane inside one proxy (docs/tiering.md, "In the proxy"): the service that
starts its parts, and its answers to Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
DeleteRecords and AddPartitionsToTxn on tiered partitions.
"""

"""What each shard's owner does in the background: cutover and untier (seals), offload commits,
retention and DeleteRecords trims, compaction, object GC and the orphan sweep; each a pure
plan beside an asyncio runner.
"""

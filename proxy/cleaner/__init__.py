"""Kafka's log cleaner for tiered topics with `cleanup.policy=compact`: the pure decisions
(docs/tiering.md, "Compacted topics"). The runner is proxy/upkeep/log_cleaner.py."""

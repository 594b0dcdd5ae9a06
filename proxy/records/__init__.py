"""Kafka v2 record batches, read and rewritten per batch (never per record): headers, the
read_committed view of transactions, timestamp searches.
"""

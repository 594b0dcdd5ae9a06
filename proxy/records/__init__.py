"""Kafka v2 record batches, read and rewritten per batch (never per record): headers, the
read_committed view of transactions, timestamp searches, and the one record walk for the
few places that must read a batch's records (a timestamp lookup, naming refused records).
"""

"""Reads of tiered streams: the log cache (the owner's tail), the block cache and the stream
reader over committed objects.
"""

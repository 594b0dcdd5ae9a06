"""The proxy's write-ahead log."""

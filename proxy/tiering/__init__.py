"""The tiered data plane: partition owners, stream objects in S3, caches."""

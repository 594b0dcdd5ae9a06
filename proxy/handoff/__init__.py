"""The S3 hand-off (`tiering.notify: s3`, docs/wal.md "S3-WAL mode"): a proxy that does not own
a partition PUTs a produce's batches in an S3 object and tells the owner; the objects, the
writer, the owner's reader and their deletion.
"""

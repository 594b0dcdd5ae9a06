"""The object store (docs/object-store.md, docs/object-format.md): the store protocol and its
errors, the local and S3 stores, S3 retries and metrics, the object format and keys, and
bandwidth shared by priority.
"""

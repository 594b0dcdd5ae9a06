"""The benchmarks, each a module run from the repository root as
`.venv/bin/python -m benchmarks.NAME --help`: passthrough, zones, tiered, tiered_read,
offload, wal_append. What they share (processes, clients, the cluster, reports, the
run's own record) is in `benchmarks.common`; docs/benchmarks.md holds their results.
"""

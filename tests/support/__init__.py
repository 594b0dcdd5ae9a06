"""What every test may share: polling (`waiting`), record batches (`batches`), a clock
moved by hand (`clock`), what a real client asks of Kafka or a proxy (`clients`), kio's
message classes for any version (`kio_types`).

Imported as `tests.support` (pytest runs from the repository root, which is on sys.path:
`python -m pytest` puts it there, and the subprocess scripts insert it). A test keeps its
own helper only where the helper says something about that test.
"""

"""What every test may share: polling (`waiting`), record batches (`batches`), a clock
moved by hand (`clock`), what a real client asks of Kafka or a proxy (`clients`), kio's
message classes for any version (`kio_types`).

Imported as `tests.support`: `tests` is a package, so pytest puts the repository root on
sys.path whatever directory it starts in (the subprocess scripts insert it themselves). A
test keeps its own helper only where the helper says something about that test.
"""

"""The test suite: a package so that its shared helpers import as `tests.support` from
any directory pytest is started in (pytest puts the repository root on sys.path for it)."""

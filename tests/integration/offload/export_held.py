"""`tierproxy export --iceberg` held before its commit, for a test to kill it there.

Run as a script with the export's arguments. It replaces the Iceberg commit with a step
that prints "holding before the commit: N data files written" and waits for ever, then
runs the command as `tierproxy` would: every data file is written and none committed when
the line appears (tests/integration/offload/test_export_iceberg.py). The hold lives here,
not in the product, which has no test hooks.
"""

from __future__ import annotations

import sys
import threading

import offload_jobs.export_iceberg as export_iceberg
from proxy.cli import main


def hold(table, files, properties) -> int:
    print(f"holding before the commit: {len(files)} data files written", flush=True)
    threading.Event().wait()  # until the test kills this process
    raise AssertionError("unreachable")


if __name__ == "__main__":
    export_iceberg.commit = hold  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))

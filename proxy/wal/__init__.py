"""The proxy's write-ahead log (docs/wal.md).

- `entry`: the entry codec, pure (`encode_entry`, `read_entries`);
- `fs` / `memfs`: the filesystem interface, the real one and a fault-injecting twin;
- `segments`: segment files, the trim checkpoint, `recover`;
- `log`: `WriteAheadLog`, the one task that owns the files (group commit, trimming,
  capacity backpressure);
- `s3log` / `s3log_objects`: `S3WriteAheadLog`, the same surface with the log as objects in
  the bucket (`wal.mode: s3`: the ack waits for a PUT).
- `common`: what the two logs share (the state callers read, the checks on what they pass);
  `port`: `Log`, the surface they share.
"""

from proxy.wal.fs import Filesystem, OsFilesystem
from proxy.wal.log import WriteAheadLog
from proxy.wal.port import Log
from proxy.wal.segments import Recovery, Segment
from proxy.wal.types import (
    WalBrokenError,
    WalClosedError,
    WalConfig,
    WalCorruptError,
    WalEntry,
    WalError,
    WalOffsetOutOfRange,
    WalPosition,
    WalStats,
)

__all__ = [
    "Filesystem",
    "Log",
    "OsFilesystem",
    "Recovery",
    "Segment",
    "WalBrokenError",
    "WalClosedError",
    "WalConfig",
    "WalCorruptError",
    "WalEntry",
    "WalError",
    "WalOffsetOutOfRange",
    "WalPosition",
    "WalStats",
    "WriteAheadLog",
]

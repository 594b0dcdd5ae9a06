"""The filesystem the WAL uses, as a small interface (STYLE.md rule 5).

`OsFilesystem` is the real one; `proxy.wal.memfs.MemoryFilesystem` is its in-memory twin
that can fail the next fsync or write, tear a write, and simulate a crash.

Everything here blocks: the WAL calls it from a thread, never from the event loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal, Protocol

Buffer = bytes | bytearray | memoryview
OpenMode = Literal["read", "append", "create"]

_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
if _IOV_MAX <= 0:
    _IOV_MAX = 1024


class WalFile(Protocol):
    def write(self, buffers: Sequence[Buffer]) -> None:
        """Append all of `buffers` at the end of the file, or raise OSError (after which
        any prefix of them may be in the file)."""

    def fsync(self) -> None:
        """Make the file's data, and the size needed to read it, durable."""

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset`; fewer only at the end of the file."""

    def size(self) -> int: ...

    def truncate(self, size: int) -> None: ...

    def close(self) -> None: ...


class Filesystem(Protocol):
    def open(self, path: str, mode: OpenMode) -> WalFile:
        """`read`: an existing file, read only; `append`: an existing file, writes go to
        its end; `create`: a new file (FileExistsError if there is one), writes go to its
        end. FileNotFoundError when the file is missing."""

    def list_dir(self, path: str) -> list[str]:
        """The names in a directory (not paths)."""

    def make_dirs(self, path: str) -> None: ...

    def rename(self, src: str, dst: str) -> None: ...

    def unlink(self, path: str) -> None: ...

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (files created, renamed, removed) durable."""


class OsFile:
    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, buffers: Sequence[Buffer]) -> None:
        # writev, so the batches are written from the caller's buffers without a copy;
        # a short write (signals, full disk) is resumed where it stopped.
        views = [memoryview(b).cast("B") for b in buffers if len(b)]
        first = 0
        while first < len(views):
            written = os.writev(self._fd, views[first : first + _IOV_MAX])
            while written:
                head = views[first]
                if written >= len(head):
                    written -= len(head)
                    first += 1
                else:
                    views[first] = head[written:]
                    written = 0

    def fsync(self) -> None:
        # fdatasync also flushes the size, which is all the metadata reading back needs
        sync = getattr(os, "fdatasync", os.fsync)
        sync(self._fd)

    def read(self, offset: int, size: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) in (0, size):
            return data
        parts = [data]
        got = len(data)
        while got < size:
            more = os.pread(self._fd, size - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def size(self) -> int:
        return os.fstat(self._fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OsFilesystem:
    """The real filesystem (POSIX)."""

    _FLAGS = {
        "read": os.O_RDONLY,
        "append": os.O_RDWR | os.O_APPEND,
        "create": os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL,
    }

    def open(self, path: str, mode: OpenMode) -> OsFile:
        return OsFile(os.open(path, self._FLAGS[mode] | getattr(os, "O_CLOEXEC", 0), 0o644))

    def list_dir(self, path: str) -> list[str]:
        return os.listdir(path)

    def make_dirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

"""An in-memory twin of `OsFilesystem` that can misbehave on purpose, for unit tests.

It keeps what the real one promises, and no more:
- a file's bytes become durable at its `fsync`; `crash()` keeps only those (plus, if asked,
  some of the bytes written after them: a torn tail);
- a directory's entries (creations, renames, removals) become durable at `fsync_dir`;
  `crash()` brings back the directory as it was then;
- an open file keeps its contents after it was renamed or removed, as on POSIX.

Faults, each for the next call only: `fail_next_fsync()`, `fail_next_write()`,
`tear_next_write(keep)` (writes `keep` bytes, then fails). `hold_fsyncs()` makes fsyncs
wait until `release_fsyncs()`, so a test can pile appends up behind one fsync.

Thread-safe: the WAL calls it from a worker thread while the test runs on the loop.
"""

from __future__ import annotations

import errno
import posixpath
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.wal.fs import Buffer, OpenMode


@dataclass(eq=False)
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: int = 0  # data[:synced] is durable
    # [start, end) of bytes whose writeback failed (a failed fsync): Linux marks their
    # pages clean, so no later fsync writes them; on the disk they are zeros
    unwritten: list[tuple[int, int]] = field(default_factory=list)

    def durable(self, keep_unsynced: int = 0) -> bytearray:
        kept = bytearray(self.data[: self.synced + keep_unsynced])
        for start, end in self.unwritten:
            end = min(end, len(kept))
            if start < end:
                kept[start:end] = bytes(end - start)
        return kept


def _eio(what: str) -> OSError:
    return OSError(errno.EIO, f"injected fault: {what}")


class MemoryFile:
    def __init__(self, fs: MemoryFilesystem, inode: _Inode, writable: bool) -> None:
        self._fs = fs
        self._inode = inode
        self._writable = writable
        self._closed = False

    def write(self, buffers: Sequence[Buffer]) -> None:
        self._check(write=True)
        data = b"".join(bytes(b) for b in buffers)
        with self._fs._lock:
            fault = self._fs._write_fault
            self._fs._write_fault = None
            free = self._fs._free_bytes()
            if fault is None and (free is None or len(data) <= free):
                self._inode.data += data
                return
            if fault is None:
                assert free is not None
                self._inode.data += data[:free]
                raise OSError(errno.ENOSPC, f"no space left: {free} of {len(data)} bytes written")
            keep = min(fault, len(data))
            self._inode.data += data[:keep]
        raise _eio(f"write failed after {keep} of {len(data)} bytes")

    def fsync(self) -> None:
        self._check(write=False)
        self._fs._wait_for_fsync_release()
        with self._fs._lock:
            self._fs.fsync_calls += 1
            code, self._fs._fail_fsync = self._fs._fail_fsync, None
            if code is not None:
                inode = self._inode
                if inode.synced < len(inode.data):
                    inode.unwritten.append((inode.synced, len(inode.data)))
                raise OSError(code, f"injected fault: fsync failed ({errno.errorcode[code]})")
            self._inode.synced = len(self._inode.data)

    def read(self, offset: int, size: int) -> bytes:
        self._check(write=False)
        with self._fs._lock:
            return bytes(self._inode.data[offset : offset + size])

    def size(self) -> int:
        self._check(write=False)
        with self._fs._lock:
            return len(self._inode.data)

    def truncate(self, size: int) -> None:
        self._check(write=True)
        with self._fs._lock:
            inode = self._inode
            del inode.data[size:]
            inode.synced = min(inode.synced, size)
            # the pages past the cut go from the page cache, written or not
            inode.unwritten = [(a, min(b, size)) for a, b in inode.unwritten if a < size]

    def close(self) -> None:
        self._closed = True

    def _check(self, *, write: bool) -> None:
        if self._closed:
            raise ValueError("I/O on a closed file")
        if write and not self._writable:
            raise OSError(errno.EBADF, "file not open for writing")


class MemoryFilesystem:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: dict[str, dict[str, _Inode]] = {}
        self._durable_dirs: dict[str, dict[str, _Inode]] = {}
        self._fail_fsync: int | None = None  # the errno of the next fsync's failure
        self._write_fault: int | None = None
        self._fsync_gate: threading.Event | None = None
        self.fsync_calls = 0
        self.fsync_dir_calls = 0
        self._space: int | None = None  # bytes all files may hold together; None: no limit

    # -- faults ---------------------------------------------------------------------

    def fail_next_fsync(self, code: int = errno.EIO) -> None:
        """The next fsync fails with `code` (EIO; ENOSPC for a disk that says it is full
        only at writeback: NFS, thin provisioning, delayed allocation), and the bytes it
        was to make durable never reach the disk, as on Linux: their pages are marked
        clean, so a later fsync that succeeds does not write them (a crash finds zeros
        there), unless they are cut off and written again."""
        with self._lock:
            self._fail_fsync = code

    def fail_next_write(self) -> None:
        self.tear_next_write(0)

    def tear_next_write(self, keep: int) -> None:
        """The next write puts only its first `keep` bytes in the file, then fails."""
        with self._lock:
            self._write_fault = keep

    def set_space(self, total_bytes: int | None) -> None:
        """A disk of `total_bytes` (all files together): a write past it puts what fits
        and fails with ENOSPC, as a full disk does. None: no limit."""
        with self._lock:
            self._space = total_bytes

    def _free_bytes(self) -> int | None:
        """Room left on the disk (the caller holds the lock)."""
        if self._space is None:
            return None
        used = sum(len(inode.data) for d in self._dirs.values() for inode in d.values())
        return max(0, self._space - used)

    def hold_fsyncs(self) -> None:
        with self._lock:
            self._fsync_gate = threading.Event()

    def release_fsyncs(self) -> None:
        with self._lock:
            gate, self._fsync_gate = self._fsync_gate, None
        if gate is not None:
            gate.set()

    def crash(self, keep_unsynced: int = 0) -> MemoryFilesystem:
        """What a machine that lost power now would find after a reboot: the directories
        as of their last `fsync_dir`, each file's bytes as of its last `fsync`, plus up
        to `keep_unsynced` of the bytes written after that."""
        after = MemoryFilesystem()
        with self._lock:
            for path, entries in self._durable_dirs.items():
                after._dirs[path] = {}
                for name, inode in entries.items():
                    kept = inode.durable(keep_unsynced)
                    after._dirs[path][name] = _Inode(kept, len(kept))
            after._durable_dirs = {path: dict(names) for path, names in after._dirs.items()}
        return after

    # -- the Filesystem interface ---------------------------------------------------

    def open(self, path: str, mode: OpenMode) -> MemoryFile:
        parent, name = self._split(path)
        with self._lock:
            entries = self._entries(parent)
            inode = entries.get(name)
            if mode == "create":
                if inode is not None:
                    raise FileExistsError(errno.EEXIST, "file exists", path)
                inode = entries[name] = _Inode()
            elif inode is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return MemoryFile(self, inode, writable=mode != "read")

    def list_dir(self, path: str) -> list[str]:
        with self._lock:
            return sorted(self._entries(posixpath.normpath(path)))

    def make_dirs(self, path: str) -> None:
        path = posixpath.normpath(path)
        with self._lock:
            if path not in self._dirs:
                self._dirs[path] = {}
                # the directory itself survives a crash (its parents are not modelled)
                self._durable_dirs.setdefault(path, {})

    def rename(self, src: str, dst: str) -> None:
        src_dir, src_name = self._split(src)
        dst_dir, dst_name = self._split(dst)
        with self._lock:
            entries = self._entries(src_dir)
            if src_name not in entries:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            self._entries(dst_dir)[dst_name] = entries.pop(src_name)

    def unlink(self, path: str) -> None:
        parent, name = self._split(path)
        with self._lock:
            if self._entries(parent).pop(name, None) is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)

    def fsync_dir(self, path: str) -> None:
        path = posixpath.normpath(path)
        with self._lock:
            self.fsync_dir_calls += 1
            self._durable_dirs[path] = dict(self._entries(path))

    # -- test helpers ---------------------------------------------------------------

    def file_bytes(self, path: str) -> bytes:
        parent, name = self._split(path)
        with self._lock:
            return bytes(self._entries(parent)[name].data)

    def append_bytes(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Add bytes to a file behind the WAL's back (a torn tail, garbage)."""
        parent, name = self._split(path)
        with self._lock:
            inode = self._entries(parent)[name]
            inode.data += data
            if durable:
                inode.synced = len(inode.data)

    def _entries(self, directory: str) -> dict[str, _Inode]:
        try:
            return self._dirs[directory]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such directory", directory) from None

    def _split(self, path: str) -> tuple[str, str]:
        parent, name = posixpath.split(posixpath.normpath(path))
        return parent, name

    def _wait_for_fsync_release(self) -> None:
        with self._lock:
            gate = self._fsync_gate
        if gate is not None:
            gate.wait()

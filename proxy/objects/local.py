"""The embedded default object store: one file per object under a root directory.

Key `a/b/c` is the file `<root>/a/b/c`. A put writes `.c.<random>.tmp` beside it, fsyncs it,
renames it over `c` and fsyncs the directory, so an object is either absent, the old one or
the whole new one, also after a crash. A create links the temporary file to `c` instead
(`link` fails when `c` exists, where a rename would replace it) and removes it. Names
starting with `.` are the store's own and are refused as keys (objectstore.check_key) and
hidden from `list`.

File I/O runs on a small thread pool of the store's own, so a slow disk never blocks the
event loop and never starves the loop's default executor.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from proxy.objects.store import (
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    Payload,
    check_key,
    check_range,
    check_tail_length,
    pieces_of,
)

T = TypeVar("T")
TMP_SUFFIX = ".tmp"
# The key names a directory, or goes through a file: as S3 sees it, there is no object.
_ABSENT = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


class LocalDirectoryStore:
    """Objects as files under `root` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str], *, io_threads: int = 4) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(io_threads, thread_name_prefix="tierproxy-localstore")
        self._closed = False

    async def __aenter__(self) -> LocalDirectoryStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def put(self, key: str, data: Payload) -> None:
        await self._write(key, data, "put", exclusive=False)

    async def create(self, key: str, data: Payload) -> None:
        await self._write(key, data, "create", exclusive=True)

    async def _write(self, key: str, data: Payload, operation: str, *, exclusive: bool) -> None:
        path = self._path(key)
        pieces = pieces_of(data)
        try:
            await self._run(self._put_sync, path, pieces, exclusive)
        except FileExistsError as exc:
            if exclusive and not await self._run(path.is_dir):
                raise ObjectExists(key) from exc
            raise ObjectStoreError(
                key, operation, f"{exc}: a directory store cannot hold both 'a' and 'a/b' as keys"
            ) from exc
        except (IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectStoreError(
                key, operation, f"{exc}: a directory store cannot hold both 'a' and 'a/b' as keys"
            ) from exc
        except OSError as exc:
            raise ObjectStoreError(key, operation, exc) from exc

    async def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        path = self._path(key)
        start, end = check_range(start, end)
        if end is not None and end <= start:
            return b""
        return await self._read(key, "get", self._read_sync, path, start, end)

    async def get_tail(self, key: str, length: int) -> bytes:
        path = self._path(key)
        length = check_tail_length(length)
        return await self._read(key, "get", self._read_tail_sync, path, length)

    async def size(self, key: str) -> int:
        path = self._path(key)
        return await self._read(key, "head", self._size_sync, path)

    async def delete(self, keys: Iterable[str]) -> None:
        if isinstance(keys, str):
            raise TypeError("delete takes a list of keys, not one key")
        paths = [self._path(key) for key in keys]
        if not paths:
            return
        try:
            await self._run(self._delete_sync, paths)
        except OSError as exc:
            raise ObjectStoreError(None, "delete", exc) from exc

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        directory = prefix.rpartition("/")[0]
        if directory:
            check_key(directory)
        try:
            infos = await self._run(self._list_sync, directory, prefix)
        except OSError as exc:
            raise ObjectStoreError(prefix, "list", exc) from exc
        for info in infos:
            yield info

    async def remove_temp_files(self) -> int:
        """Delete temporary files left by puts that a crash interrupted; returns how many.
        Call at start, before any put."""
        return await self._run(self._remove_temp_files_sync)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Waits for writes in flight: a put already handed to a thread still completes.
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

    # -- the event-loop side ---------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise RuntimeError("the object store is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _read(self, key: str, operation: str, fn: Callable[..., T], *args: object) -> T:
        try:
            return await self._run(fn, *args)
        except _ABSENT as exc:
            raise ObjectNotFound(key, operation) from exc
        except OSError as exc:
            raise ObjectStoreError(key, operation, exc) from exc

    # -- the thread side -------------------------------------------------------------------

    def _put_sync(self, path: Path, pieces: list[memoryview], exclusive: bool) -> None:
        directory = path.parent
        self._make_dirs(directory)
        tmp = directory / f".{path.name}.{secrets.token_hex(8)}{TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                for piece in pieces:
                    _write_all(fd, piece)
                _fsync_file(fd)
            finally:
                os.close(fd)
            if exclusive:
                os.link(tmp, path)  # FileExistsError if there is one: never replaced
                tmp.unlink()
            else:
                _rename(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        # The rename is durable once the directory is; until then a crash may undo it.
        _fsync_dir(directory)

    def _make_dirs(self, directory: Path) -> None:
        """Create `directory` and its missing parents, fsyncing each parent whose entries
        changed, so a durable object never sits in a directory that a crash can lose."""
        missing = []
        while not directory.is_dir():
            missing.append(directory)
            directory = directory.parent
        for new in reversed(missing):
            try:
                new.mkdir()
            except FileExistsError:
                if not new.is_dir():
                    raise
                continue  # another put created it
            _fsync_dir(new.parent)

    @staticmethod
    def _read_sync(path: Path, start: int, end: int | None) -> bytes:
        with open(path, "rb", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            stop = size if end is None else min(end, size)
            return _pread_all(file.fileno(), start, stop)

    @staticmethod
    def _read_tail_sync(path: Path, length: int) -> bytes:
        with open(path, "rb", buffering=0) as file:
            size = os.fstat(file.fileno()).st_size
            return _pread_all(file.fileno(), max(0, size - length), size)

    @staticmethod
    def _size_sync(path: Path) -> int:
        with open(path, "rb", buffering=0) as file:  # open, not stat: a directory is absent
            return os.fstat(file.fileno()).st_size

    @staticmethod
    def _delete_sync(paths: list[Path]) -> None:
        directories = set()
        for path in paths:
            try:
                path.unlink()
            except _ABSENT:
                continue
            directories.add(path.parent)
        for directory in directories:
            _fsync_dir(directory)

    def _list_sync(self, directory: str, prefix: str) -> list[ObjectInfo]:
        top = self.root.joinpath(*directory.split("/")) if directory else self.root
        found = []
        stack = [(top, f"{directory}/" if directory else "")]
        while stack:
            folder, key_prefix = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # a temporary file, or not ours
                key = key_prefix + entry.name
                if entry.is_dir(follow_symlinks=False):
                    if key.startswith(prefix) or prefix.startswith(key + "/"):
                        stack.append((Path(entry.path), key + "/"))
                elif key.startswith(prefix):
                    try:
                        stat = entry.stat()
                        found.append(ObjectInfo(key, stat.st_size, stat.st_mtime))
                    except FileNotFoundError:
                        continue  # deleted while we listed
        found.sort(key=lambda info: info.key.encode("utf-8", "surrogatepass"))
        return found

    def _remove_temp_files_sync(self) -> int:
        removed = 0
        for folder, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(".") and name.endswith(TMP_SUFFIX):
                    Path(folder, name).unlink(missing_ok=True)
                    removed += 1
        return removed


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_file(fd: int) -> None:
    os.fsync(fd)


def _rename(src: Path, dst: Path) -> None:
    os.replace(src, dst)  # atomic: readers see the old file or the new one


def _pread_all(fd: int, start: int, stop: int) -> bytes:
    if stop <= start:
        return b""
    chunks = []
    while start < stop:
        chunk = os.pread(fd, stop - start, start)
        if not chunk:
            break  # the file shrank under us; cannot happen to a file we only rename into place
        chunks.append(chunk)
        start += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

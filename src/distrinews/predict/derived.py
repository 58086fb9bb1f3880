"""Files made from a checkpoint (its ONNX graphs, ``model.onnx`` and ``model.int8.onnx``), kept in a cache outside it.

A published checkpoint is never written again (torch DCP's rule): a ``step-N``'s manifest lists every file it holds, so
a file added later makes it refused. What a runtime or ``export`` makes from a checkpoint goes to the cache
(``data/cache_dir.py``) instead:

    derived/KEY/NAME.json           the entry: which file holds NAME, its size and SHA-256
    derived/KEY/STEM.DIGEST.onnx    that file (NAME with its SHA-256 before the suffix), never rewritten

KEY is the checkpoint's content (a ``step-N``'s manifest, else every file's name and SHA-256), so an entry is only ever
used with the checkpoint it was made from. An entry is checked before use: opened without following a link, a regular
file of this user, at most ``MAX_BYTES``, of the size and SHA-256 its record gives; anything else is removed and made
again, never used. Files are published whole. Standard library only: the slim ONNX server reads the cache without torch.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import records
from ..checkpoint.atomic import remove_entry
from ..data.cache_dir import default_cache_dir

# The graphs' names, in a checkpoint folder that ships them and in the cache
FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"

log = logging.getLogger(__name__)

DERIVED = "derived"
KEY_VERSION = 1  # made differently (another opset, another quantization): another key, so old entries are not used
MAX_BYTES = 2 << 30  # protobuf's limit for one ONNX file: no graph made here is larger
RECORD_LIMIT = 4096  # an entry's record holds a name, a size and a digest
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO planted there must not block
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class EntryRefused(OSError):
    """What stands in the cache is not an entry this process may use (why: the message)."""


def hash_file(
    path: str | os.PathLike[str], digest: hashlib._Hash | None = None, flags: int = os.O_RDONLY
) -> hashlib._Hash:
    """``digest`` (a new SHA-256 if None) updated with the bytes of the file at ``path``, read a MiB at a time."""
    digest = digest or hashlib.sha256()
    fd = os.open(path, flags)
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest


def content_key(checkpoint: str | os.PathLike[str]) -> str:
    """The checkpoint's content as a cache key (see the module's docstring); the same bytes, the same key."""
    checkpoint = Path(checkpoint)
    digest = hashlib.sha256(f"distrinews-derived-v{KEY_VERSION}\0".encode())
    found = records.recognise(checkpoint)  # not a checkpoint: refused here, before anything is hashed
    if found.kind == "pt":
        hash_file(checkpoint, digest, _OPEN)
    elif found.kind == "resumable":
        from ..checkpoint.manifest import MANIFEST  # a step-N needs torch to load anyway

        digest.update(b"manifest\0")
        hash_file(checkpoint / MANIFEST, digest, _OPEN)
    else:
        for path in sorted(checkpoint.rglob("*")):
            mode = os.lstat(path).st_mode
            digest.update(f"{path.relative_to(checkpoint)}\0{stat.S_IFMT(mode)}\0".encode())
            if stat.S_ISREG(mode):
                hash_file(path, digest, _OPEN)
    return digest.hexdigest()[:32]


def _read_at(dir_fd: int, name: str, limit: int) -> bytes:
    """The bytes of the regular file ``name`` in the folder ``dir_fd``, this user's, at most ``limit`` bytes."""
    fd = os.open(name, _OPEN, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise EntryRefused(f"{name} is not a regular file of this user")
        if info.st_size > limit:
            raise EntryRefused(f"{name} holds {info.st_size:,} bytes, over the {limit:,} an entry may")
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left and (chunk := os.read(fd, min(left, 1 << 24))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _open_folder(path: Path, create: bool) -> int:
    """A folder of the cache, opened without following a link, this user's; made (0700) where missing if ``create``.
    A link, file or another user's folder in its place: removed and made again if ``create``, else refused."""
    for attempt in (1, 2):
        if create:
            with contextlib.suppress(FileExistsError):
                path.mkdir(mode=0o700)
        try:
            fd = os.open(path, _DIR)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or not create or attempt == 2:
                raise
            remove_entry(path)  # a link or a file it did not make: removed, never followed
            continue
        if os.fstat(fd).st_uid == os.geteuid():
            return fd
        os.close(fd)
        if not create or attempt == 2:
            raise EntryRefused(f"{path} belongs to another user")
        remove_entry(path)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Graph:
    """A file of the cache that passed its checks: where it is (for messages and ``/info``) and its SHA-256, by which
    ``read`` checks it again each time it is read (an ONNX Runtime session is made from the bytes, not the path)."""

    path: Path
    sha256: str

    def read(self) -> bytes:
        fd = os.open(self.path.parent, _DIR)
        try:
            data = _read_at(fd, self.path.name, MAX_BYTES)
        finally:
            os.close(fd)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise EntryRefused(f"{self.path} changed after it was checked")
        return data


class DerivedFiles:
    """The cache entries of one checkpoint: ``read`` what was made from it, ``store`` what is made."""

    def __init__(self, checkpoint: str | os.PathLike[str], root: str | os.PathLike[str] | None = None):
        self.checkpoint = Path(checkpoint)
        self.root = Path(root) if root is not None else default_cache_dir()
        self.folder = self.root / DERIVED / content_key(self.checkpoint)

    def _record(self, name: str) -> str:
        return f"{name}.json"

    def read(self, name: str) -> Graph | None:
        """The entry ``name`` where it exists and passes every check, else None; a bad one is removed (one log line)."""
        try:
            fd = _open_folder(self.folder, create=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("derived files of %s: %s is refused (%s): making them again", self.checkpoint, self.folder, exc)
            return None
        try:
            return self._read_entry(fd, name)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("derived file %s of %s is refused (%s): making it again", name, self.checkpoint, exc)
            self._discard(name)
            return None
        finally:
            os.close(fd)

    def _read_entry(self, fd: int, name: str) -> Graph:
        record = json.loads(_read_at(fd, self._record(name), RECORD_LIMIT))
        if not isinstance(record, dict) or not isinstance(record.get("file"), str):
            raise ValueError(f"{self._record(name)} is not an entry's record")
        file = record["file"]
        if "/" in file or file.startswith(".") or file == self._record(name):
            raise ValueError(f"{self._record(name)} names {file!r}, not a file of its folder")
        data = _read_at(fd, file, MAX_BYTES)
        sha = hashlib.sha256(data).hexdigest()
        if len(data) != record.get("bytes") or sha != record.get("sha256"):
            raise ValueError(f"{file} is not the file its record describes (truncated or altered)")
        return Graph(self.folder / file, sha)

    def store(self, name: str, data: bytes) -> Graph:
        """Publish ``data`` as the entry ``name`` (replacing any), whole; ``OSError`` if the cache cannot take it."""
        if len(data) > MAX_BYTES:
            raise ValueError(f"{name}: {len(data):,} bytes, over the {MAX_BYTES:,} an entry may hold")
        sha = hashlib.sha256(data).hexdigest()
        stem, dot, suffix = name.rpartition(".")
        file = f"{stem}.{sha[:16]}.{suffix}" if dot else f"{name}.{sha[:16]}"
        self.root.mkdir(parents=True, exist_ok=True)  # the cache root itself is the user's to place (a link too)
        os.close(_open_folder(self.root / DERIVED, create=True))
        fd = _open_folder(self.folder, create=True)
        try:
            _write_at(fd, file, data)
            _write_at(fd, self._record(name), json.dumps({"file": file, "bytes": len(data), "sha256": sha}).encode())
            os.fsync(fd)
            self._remove_unrecorded(fd)
        finally:
            os.close(fd)
        return Graph(self.folder / file, sha)

    def _remove_unrecorded(self, fd: int) -> None:
        """What no record names any more (an earlier ``store``'s file, a link planted beside them) and a killed
        ``store``'s temporary files, once over an hour old: a ``store`` running beside this one has written its
        file and not yet its record."""
        names = os.listdir(fd)
        recorded = set()
        for entry in names:
            if entry.endswith(".json") and not entry.startswith("."):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    recorded.add(json.loads(_read_at(fd, entry, RECORD_LIMIT)).get("file"))
        stale = time.time() - 3600
        for entry in names:
            if entry.endswith(".json") or entry in recorded:
                continue
            with contextlib.suppress(FileNotFoundError):  # another store removed it first
                if os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mtime < stale:
                    remove_entry(self.folder / entry)

    def _discard(self, name: str) -> None:
        try:
            remove_entry(self.folder / self._record(name))
        except OSError as exc:
            log.warning("could not remove the refused entry %s: %s", self.folder / self._record(name), exc)


def _write_at(dir_fd: int, name: str, data: bytes) -> None:
    """``name`` in the folder ``dir_fd`` holds ``data`` whole, or what it held before (a link there is replaced)."""
    tmp = f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise

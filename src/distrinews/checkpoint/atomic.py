"""Directories (and small text files) published whole: written under a temporary name, fsynced, moved into place
with ``os.replace``; and the file operations of a run or output folder, which never follow a symbolic link.

A kill mid-save leaves the previous directory whole; a save that fails removes its temporary directory (a kill
leaves it to ``rundir.clean_stale_tmp``).

A folder a run writes may hold links it did not make: writing through one would change the file it points to, and
removing a folder through one would empty another. So files are opened ``O_NOFOLLOW`` (new ones ``O_EXCL``), folders
checked with ``lstat``, a link removed instead of entered; a link in the way is refused in one line, naming it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError


def symlink_refused(path: os.PathLike[str] | str) -> ConfigError:
    return ConfigError(
        f"{path} is a symbolic link; refusing to follow it (a run writes only through files it made: remove it)"
    )


def open_nofollow(path: os.PathLike[str] | str, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that refuses a symbolic link at ``path`` (one line) and anything but a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise symlink_refused(path) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{path} is not a regular file; refusing to use it")
    os.set_blocking(fd, True)
    return fd


def open_new(path: os.PathLike[str] | str, mode: str = "wb", **kwargs: Any) -> IO[Any]:
    """A new, empty file at ``path`` (whatever stood there, a link included, is removed first, not followed)."""
    remove_entry(Path(path))
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), mode, **kwargs)


def read_text_nofollow(path: Path) -> str | None:
    """The text of the regular file at ``path``, None if there is none; a link is refused."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, encoding="utf-8") as fh:
        return fh.read()


def same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` (not followed) is still the file open as ``fd``: a lock file its holder removed and
    another run made anew is not the one this process locked."""
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def make_dir(path: Path) -> None:
    """``path`` as a folder of its own (made if missing, its parents too); a link or a file there is refused."""
    with suppress(FileExistsError):
        path.mkdir(parents=True)
        return
    mode = os.lstat(path).st_mode
    if stat.S_ISLNK(mode):
        raise symlink_refused(path)
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{path} is a file, not a folder")


def remove_entry(path: Path) -> None:
    """Remove what is at ``path``: a folder with its content (``rmtree`` enters no link), a file or a link itself."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before: a reader never sees half of it (a link at ``path``
    is replaced, not written through)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open_new(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def fresh_tmp(final: Path) -> Path:
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    return tmp


@contextmanager
def removed_on_failure(tmp: Path | None) -> Iterator[None]:
    """Remove the temp directory ``tmp`` (None: this rank made none) when the block raises an error (a
    KeyboardInterrupt or SystemExit leaves it to ``clean_stale_tmp``)."""
    try:
        yield
    except Exception:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a finished temp directory to ``final``; an existing ``final`` is swapped out, then removed. Each file
    is fsynced first, with the mode a plain ``open()`` would give it (0o666 less the umask): safetensors writes 0600,
    which a server running as another user (the container's, the checkpoint mounted read-only) could not read."""
    umask = os.umask(0o022)
    os.umask(umask)
    for p in tmp.iterdir():
        if stat.S_ISREG(os.lstat(p).st_mode):
            p.chmod(0o666 & ~umask)
            fd = open_nofollow(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}-{time.time_ns()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)

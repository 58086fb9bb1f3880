"""One exclusive lock on a file: what keeps a run directory to one training run (``rundir.RunLock``) and a batch
job's output, and each of its workers' folders, to one process (``predict.batch``).

A ``flock``: the kernel drops it when its holder dies, SIGKILL included, so a lock file left behind never blocks;
what the holder writes in the file only names it to whoever is refused. A process that gets the lock after its
holder removed the file sees that the file it locked is no longer the one at ``path`` and locks the one there now,
so two processes never both hold "the" lock. A symbolic link at ``path`` is never followed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .atomic import make_dir, open_nofollow, read_text_nofollow, same_file

# flock's answers for "another holds it" (EACCES on some systems), and for a file system mounted without locks.
_HELD_ELSEWHERE = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
RETRY_S = 0.05


class LocksUnsupported(OSError):
    """The file system cannot ``flock`` (some network file systems are mounted without lock support)."""


@dataclass(eq=False)
class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing, its folder by ``make_parent``) until ``release`` or
    the process ends. ``name_holder``: what the holder writes in the file; ``mode``: the new file's permissions."""

    path: Path
    make_parent: Callable[[Path], None] = make_dir
    name_holder: Callable[[], str] = lambda: f"{os.getpid()}\n"
    mode: int = 0o644
    _fd: int | None = field(default=None, init=False)

    def acquire(self, wait_s: float = 0.0) -> bool:
        """Take the lock, trying again every ``RETRY_S`` for up to ``wait_s`` seconds; False if another holds it then.
        A file system without locks raises ``LocksUnsupported``."""
        deadline = time.monotonic() + wait_s
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in _NO_LOCKS:
                    raise LocksUnsupported(exc.errno, exc.strerror, str(self.path)) from exc
                if exc.errno not in _HELD_ELSEWHERE:
                    raise
                if time.monotonic() >= deadline:
                    return False
                time.sleep(RETRY_S)
                continue
            if not same_file(fd, self.path):  # removed by its previous holder while we waited for it
                os.close(fd)
                continue
            # only ever read to word a refusal: a full disk must not stop the holder here
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, self.name_holder().encode(), 0)
            self._fd = fd
            return True

    def _open(self) -> int:
        while True:
            self.make_parent(self.path.parent)
            try:
                return open_nofollow(self.path, os.O_RDWR | os.O_CREAT, self.mode)
            except FileNotFoundError:  # the folder was removed between the two calls: make it again
                continue

    def holder(self) -> str:
        """What the holder wrote in the file ("?" when nothing yet, or unreadable)."""
        with contextlib.suppress(OSError, ValueError):
            return (read_text_nofollow(self.path) or "").strip() or "?"
        return "?"

    def release(self, remove: bool = False) -> None:
        """Let go; ``remove``: and remove the file if it is still the one locked."""
        if self._fd is not None:
            if remove and same_file(self._fd, self.path):
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(self._fd)
            self._fd = None

"""Directories (and small text files) published whole: written under a temporary name, fsynced, moved into place
with ``os.replace``.

A kill mid-save leaves the previous directory whole; a save that fails removes its temporary
directory (a kill leaves it to ``rundir.clean_stale_tmp``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_text_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def fresh_tmp(final: Path) -> Path:
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    return tmp


@contextmanager
def removed_on_failure(tmp: Path | None) -> Iterator[None]:
    """Remove the temp directory ``tmp`` (None: this rank made none) when the block raises.

    Only errors: a save stopped by KeyboardInterrupt or SystemExit leaves it to ``clean_stale_tmp``.
    """
    try:
        yield
    except Exception:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(directory: Path) -> None:
    for p in directory.iterdir():
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())


def _plain_file_modes(directory: Path) -> None:
    """Give every file the mode a plain ``open()`` would (0o666 less the umask).

    safetensors writes its files 0600, so a server running as another user (the container's
    non-root user, with the checkpoint mounted read-only) could not read the weights.
    """
    umask = os.umask(0o022)
    os.umask(umask)
    for p in directory.iterdir():
        if p.is_file():
            p.chmod(0o666 & ~umask)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a finished temp directory to ``final``; an existing ``final`` is swapped out, then removed."""
    _plain_file_modes(tmp)
    _fsync_tree(tmp)
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}-{time.time_ns()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)

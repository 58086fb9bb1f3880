"""A save that runs out of disk space: detected, cleaned up, and told in one line that every rank raises (the ranks
agree on the outcome, ``saving_together``), naming the filesystem, the space needed and the checkpoint to resume from.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..distributed.process_group import DistEnv, all_gather_object
from ..errors import DiskFullError
from .load_errors import exception_chain, first_line
from .manifest import resolve_resume

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a quota used up is a full disk to the writer


# Writers that raise no OSError: safetensors passes Rust's io::Error text along ("... (os error 28)").
# torch's zip writer says only "unexpected pos" or "file write failed"; the free space tells then.
_FULL_WORDS = (
    "no space left on device",
    "disk quota exceeded",
    f"(os error {errno.ENOSPC})",
    f"(os error {errno.EDQUOT})",
)


def _says_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, reports a full disk or a used-up quota."""
    pending, seen = [exc], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno in _FULL_ERRNOS) or any(w in str(e).lower() for w in _FULL_WORDS):
            return True
        pending += [e.__cause__, e.__context__]
    return False


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    return path


def _mount_point(path: Path) -> Path:
    path = _existing(path)
    while not os.path.ismount(path):
        path = path.parent
    return path


def _fs_type(mount: Path) -> str | None:
    """The type /proc/self/mounts gives the filesystem mounted at ``mount`` (the last mount there wins)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        fields = line.split()
        # the kernel writes a space in a mount point as \040 (octal), and so on
        if len(fields) >= 3 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]) == str(mount):
            found = fields[2]
    return found


def _size(n: float) -> str:
    if n < 1024:
        return f"{int(n)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _tensor_bytes(obj: Any, seen: set[Any] | None = None) -> int:
    """Bytes of the tensors in a nested state dict, an aliased tensor once; a sharded tensor counts whole."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        try:
            key: Any = (obj.data_ptr(), obj.dtype, tuple(obj.shape))
        except Exception:  # tensors without storage of their own here (DTensor, meta)
            key = id(obj)
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, (dict, list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in (obj.values() if isinstance(obj, dict) else obj))
    return 0


def space_needed(previous: Path | None, state: Any) -> tuple[int, str]:
    """How many bytes a save takes, and in words: about the size of ``previous`` (the last complete save
    of the same kind) when there is one, else at least the bytes of the tensors in ``state``."""
    if previous is not None and previous.is_dir():
        size = sum(p.stat().st_size for p in previous.rglob("*") if p.is_file())
        return size, f"about {_size(size)}, the size of {previous.name}"
    size = _tensor_bytes(state)
    return size, f"at least {_size(size)} for its tensors"


def _disk_full_message(target: Path, checkpoints: Path, needed: tuple[int, str]) -> str:
    where = _existing(target.parent)
    mount = _mount_point(where)
    kind = _fs_type(mount)
    free = shutil.disk_usage(where).free
    newest = resolve_resume("auto", checkpoints, warn=lambda _line: None)
    if newest is not None:
        then = f"the newest complete checkpoint is {newest}: free some space, then continue with --resume auto"
    else:
        then = (
            "there is no complete checkpoint to resume from: free some "
            "space, then run again with --resume auto (it starts over)"
        )
    return (
        f"no space left to save {target}: the filesystem mounted at {mount}{f' ({kind})' if kind else ''} "
        f"has {_size(free)} free, the save needs {needed[1]}; the half-written copy was removed; {then}"
    )


@contextmanager
def saving_together(
    env: DistEnv, target: Path, checkpoints: Path, needed: Callable[[], tuple[int, str]]
) -> Iterator[None]:
    """Around the part of a save that some ranks write: all ranks leave it together, through one all-gather of how
    it went. When any rank ran out of space, every rank raises the same :class:`DiskFullError` (one line, exit
    status 2); another failure is raised again on its rank, and the others raise a RuntimeError naming it. The
    block must remove its temp directory when it fails (``removed_on_failure``), so that the free space reported is
    what a new try would find, and must not skip a collective that another rank reaches.

    ``target``: the directory being saved; ``checkpoints``: where to look for one to resume from; ``needed``: the
    bytes the save takes, asked only after a failure (``space_needed``).
    """
    failure: Exception | None = None
    try:
        yield
    except Exception as exc:
        failure = exc
    outcome: tuple[str, str] | None = None
    if failure is not None:
        # Free what its frames hold: torch's zip writer keeps its file open until it is collected, so the space of
        # the removed temp directory is not free until then.
        for current in exception_chain(failure):
            traceback.clear_frames(current.__traceback__)
        full = _says_disk_full(failure)
        if not full and getattr(failure, "errno", None) is None:
            # No errno to go by (torch's writer): a failed write with less room left than the save takes
            full = shutil.disk_usage(_existing(target.parent)).free < needed()[0]
        if full:
            outcome = ("full", _disk_full_message(target, checkpoints, needed()))
        else:
            why = f"{type(failure).__name__}: {first_line(failure)}"
            outcome = ("failed", f"rank {env.rank} could not save {target}: {why}")
    outcomes = [o for o in all_gather_object(outcome, env) if o is not None]
    full_message = next((text for kind, text in outcomes if kind == "full"), None)
    if full_message is not None:
        raise DiskFullError(full_message) from failure
    if failure is not None:
        raise failure
    if outcomes:
        raise RuntimeError(outcomes[0][1])

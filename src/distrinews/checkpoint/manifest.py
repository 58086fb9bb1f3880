"""The published ``step-N`` checkpoints of a run: listing, rotation, manifests, verification, and which one to resume.

A checkpoint is complete when its manifest (name, size and SHA-256 of every file, written last)
matches what is on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from ..errors import CheckpointError
from .load_errors import first_line
from .records import read_json

STEP_DIR = re.compile(r"^step-(\d+)$")


def list_checkpoints(root: str | os.PathLike[str]) -> list[Path]:
    """Published ``step-N`` directories, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def rotate_checkpoints(root: str | os.PathLike[str], limit: int | None) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``; returns what was removed."""
    if limit is None:
        return []
    existing = list_checkpoints(root)
    doomed = existing[: max(0, len(existing) - limit)]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


MANIFEST = "manifest.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, step: int) -> None:
    """Name, size and SHA-256 of every file of a checkpoint, written after all of them."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (directory / MANIFEST).write_text(json.dumps({"step": step, "files": entries}, indent=2))


def verify_checkpoint(path: Path) -> None:
    """Raise :class:`CheckpointError` naming the first file that is missing, truncated, altered, a link or not in the
    manifest, before any is parsed; a sharded folder's metadata is read without running code (``sharded_reader``),
    and a ``step-N`` whose manifest names another step was not saved there."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: no {MANIFEST} (its save did not finish)")
    recorded = read_json(manifest)  # bounded, never through a link; a file that does not parse is refused
    try:
        entries, step = recorded["files"], recorded["step"]
        sizes = {name: int(entry["bytes"]) for name, entry in entries.items()}
        hashes = {name: str(entry["sha256"]) for name, entry in entries.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {path} is damaged: {manifest} cannot be read ({first_line(exc)})") from None
    named = STEP_DIR.match(path.name)
    if named and step != int(named.group(1)):
        raise CheckpointError(
            f"checkpoint {path} is not what its save wrote: {manifest} is the manifest of step {step}"
        )
    on_disk = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_symlink() or not p.is_dir()} - {MANIFEST}
    for name in sorted(on_disk):
        if (path / name).is_symlink() or not (path / name).is_file():
            raise CheckpointError(
                f"checkpoint {path} is refused: {path / name} is not a plain file (a save writes only files)"
            )
    if unlisted := sorted(on_disk - set(entries)):
        raise CheckpointError(f"checkpoint {path} is refused: {path / unlisted[0]} is not in its {MANIFEST}")
    for name in entries:
        f = path / name
        if name not in on_disk:
            raise CheckpointError(f"checkpoint {path} is incomplete: {f} is missing")
        size = f.stat().st_size
        if size != sizes[name]:
            raise CheckpointError(f"checkpoint {path} is damaged: {f} has {size:,} bytes, {sizes[name]:,} were written")
        if _sha256(f) != hashes[name]:
            raise CheckpointError(f"checkpoint {path} is damaged: {f} does not match its checksum")
    from .sharded_reader import METADATA, read_metadata

    for name in sorted(entries):
        if Path(name).name == METADATA:
            read_metadata(path / name)


def resolve_resume(
    spec: str | None, checkpoints: str | os.PathLike[str], warn: Callable[[str], None] = print
) -> Path | None:
    """The checkpoint to continue from, verified against its manifest. ``auto``: the newest complete one (None when
    there is none), a newer one that ``verify_checkpoint`` refuses (or a link) skipped with one warning line. A path:
    that checkpoint, which must be complete (else :class:`CheckpointError` naming the bad file)."""
    if spec is None:
        return None
    if spec == "auto":
        for path in reversed(list_checkpoints(checkpoints)):
            try:
                if path.is_symlink():
                    raise CheckpointError(f"{path} is a symbolic link, which a save never makes")
                verify_checkpoint(path)
                return path
            except CheckpointError as exc:
                warn(f"warning: skipping {path.name}: {exc}; trying the one before")
        return None
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(
            f"--resume {spec}: no such checkpoint directory; expected runs/<name>/checkpoints/step-N or 'auto'"
        )
    verify_checkpoint(path)
    return path

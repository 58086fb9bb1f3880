"""Checkpoints: resumable ``checkpoints/step-N/``, the servable ``best/``, and the legacy single ``.pt`` file.

Every directory is written under a temporary name and moved into place with ``os.replace``,
so a kill mid-save leaves the previous checkpoint whole. A save that fails (a full disk) removes its
temporary directory, and the ranks agree on the outcome (``saving_together``): out of space, every
rank raises the same one-line :class:`DiskFullError`. Tensors are stored as safetensors;
whatever goes through ``torch.load`` is loaded with ``weights_only=True``.

The legacy ``.pt`` form is the one the reference system (``../shared/seeds``) saved:
``{epoch, model_state_dict, optimizer_state_dict, loss, accuracy, config}``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from . import __version__
from .distributed import DistEnv, all_gather_object, barrier, broadcast_object
from .errors import CheckpointError, DiskFullError
from .model import LABELS, SHIPPED_MINILM, TINY_RANDOM, build_tokenizer, merged, resolve_model_path
from .modelcard import write_model_card
from .tokenizer_files import has_tokenizer, needs_own_tokenizer, require_tokenizer
from .versioning import version_fields

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step-(\d+)$")
SERVABLE_INFO = "distrinews.json"


# ------------------------------------------------------------------ errors
def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).strip().splitlines()[0].strip() if str(exc).strip() else type(exc).__name__
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # torch colours its hints
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _why(exc: BaseException) -> str:
    """What went wrong, in words a person can act on, without torch's advice to unpickle anyway."""
    if isinstance(exc, pickle.UnpicklingError) and "weights only load failed" in str(exc).lower():
        blocked = re.search(r"GLOBAL ([\w.]+)", str(exc))
        return f"the file contains pickled code that is not allowed ({f'{blocked.group(1)}; ' if blocked else ''}refused, not loaded)"
    if isinstance(exc, SafetensorError):
        return f"the safetensors file is invalid or truncated ({_first_line(exc)})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, (pickle.UnpicklingError, EOFError)) or (isinstance(exc, RuntimeError) and "PytorchStreamReader" in str(exc)):
        return f"not a readable PyTorch checkpoint file ({_first_line(exc)})"
    message = _first_line(exc)
    if "weights_only" in message:
        return f"{type(exc).__name__} (refused; not loaded)"
    if isinstance(exc, FileNotFoundError):
        return f"missing file {exc.filename or message}"
    if isinstance(exc, KeyError):
        return f"missing key {message}"
    return f"{type(exc).__name__}: {message}"


# What reading a damaged, incomplete or refused checkpoint raises (torch, safetensors, transformers, json).
_LOAD_ERRORS = (pickle.UnpicklingError, SafetensorError, OSError, EOFError, ValueError, KeyError, RuntimeError)


@contextmanager
def _loading(where: Path, also: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Turn a failure to read ``where`` into one-line :class:`CheckpointError` naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except _LOAD_ERRORS + also as exc:
        raise CheckpointError(f"could not load checkpoint {where}: {_why(exc)}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    with _loading(path):
        return json.loads(path.read_text())


# ------------------------------------------------------------------ atomic directories
def _fresh_tmp(final: Path) -> Path:
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    return tmp


@contextmanager
def _removed_on_failure(tmp: Path | None) -> Iterator[None]:
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


def _publish_dir(tmp: Path, final: Path) -> None:
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


# ------------------------------------------------------------------ running out of space
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a quota used up is a full disk to the writer
# Writers that raise no OSError: safetensors passes Rust's io::Error text along ("... (os error 28)").
# torch's zip writer says only "unexpected pos" or "file write failed"; the free space tells then.
_FULL_WORDS = ("no space left on device", "disk quota exceeded", f"(os error {errno.ENOSPC})", f"(os error {errno.EDQUOT})")


def _says_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, reports a full disk or a used-up quota."""
    pending, seen = [exc], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        if any(word in str(e).lower() for word in _FULL_WORDS):
            return True
        pending += [e.__cause__, e.__context__]
    return False


def _close_failed_writers(exc: BaseException) -> None:
    """Free what the frames of ``exc`` (and of what it was raised from) hold: torch's zip writer keeps its
    file open until it is collected, so the space of the removed temp directory is not free until then."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__


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


def _tensor_bytes(obj: Any, seen: set | None = None) -> int:
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
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
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
        then = "there is no complete checkpoint to resume from: free some space, then run again with --resume auto (it starts over)"
    return (
        f"no space left to save {target}: the filesystem mounted at {mount}{f' ({kind})' if kind else ''} has {_size(free)} free, "
        f"the save needs {needed[1]}; the half-written copy was removed; {then}"
    )


@contextmanager
def saving_together(env: DistEnv, target: Path, checkpoints: Path, needed: Callable[[], tuple[int, str]]) -> Iterator[None]:
    """Around the part of a save that some ranks write (rank 0 alone, or every rank): all ranks leave it
    together, through one all-gather of how it went, which each rank reaches whether it wrote or not.

    When any rank ran out of space, every rank raises the same :class:`DiskFullError`: one line that
    the command line prints (our launcher once for all ranks), exit status 2, and no rank left
    waiting in a collective the others never reach. Another failure is raised again on its rank, and
    the other ranks raise a RuntimeError naming it. The block must remove its temp directory when it
    fails (``_removed_on_failure``), so that the free space reported is what a new try would find,
    and must not skip a collective that another rank reaches.

    ``target`` is the directory being saved, ``checkpoints`` where to look for one to resume from,
    ``needed`` says (lazily, only after a failure) about how many bytes the save takes (``space_needed``).
    """
    failure: Exception | None = None
    try:
        yield
    except Exception as exc:
        failure = exc
    outcome: tuple[str, str] | None = None
    if failure is not None:
        _close_failed_writers(failure)
        full = _says_disk_full(failure)
        if not full and getattr(failure, "errno", None) is None:
            # No errno to go by (torch's writer): a failed write with less room left than the save takes
            full = shutil.disk_usage(_existing(target.parent)).free < needed()[0]
        if full:
            outcome = ("full", _disk_full_message(target, checkpoints, needed()))
        else:
            outcome = ("failed", f"rank {env.rank} could not save {target}: {type(failure).__name__}: {_first_line(failure)}")
    outcomes = [o for o in all_gather_object(outcome, env) if o is not None]
    full_message = next((text for kind, text in outcomes if kind == "full"), None)
    if full_message is not None:
        raise DiskFullError(full_message) from failure
    if failure is not None:
        raise failure
    if outcomes:
        raise RuntimeError(outcomes[0][1])


# ------------------------------------------------------------------ weights
def save_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    """A state dict as safetensors; a tensor that aliases an earlier one (tied weights) is stored once."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    unique = {}
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        unique[name] = tensor.detach().contiguous().cpu()
    save_file(unique, str(path), metadata={"format": "pt"})


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load what ``save_weights`` wrote; only aliases of stored tensors may be missing from the file."""
    state = load_file(str(path), device=str(next(model.parameters()).device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    stored = {own[k].untyped_storage().data_ptr() for k in state if k in own}
    missing = [k for k in missing if own[k].untyped_storage().data_ptr() not in stored]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")


# ------------------------------------------------------------------ RNG state
def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ------------------------------------------------------------------ resumable checkpoints
@dataclass
class LoadedCheckpoint:
    trainer_state: dict[str, Any]
    rng_states: list[dict[str, Any]]  # one per rank of the run that wrote it

    @property
    def world_size(self) -> int | None:
        return self.trainer_state.get("world_size")


SHARDED = "sharded"  # the torch.distributed.checkpoint folder of a sharded (FSDP) run


class Checkpointer:
    """Writes and reads ``root/step-N``; ``save`` and ``load`` are called by every rank.

    Replicated models (DDP, one process): rank 0 writes the weights (``model.safetensors``) and the
    optimizer state. Sharded models (FSDP): every rank writes its shards of both with
    ``torch.distributed.checkpoint`` into ``sharded/``, which loads back at any world size. Either
    way rank 0 adds the scheduler, scaler, every rank's RNG state, the trainer state and the
    config, then the manifest, last, and publishes the directory.
    """

    def __init__(self, root: str | os.PathLike, env: DistEnv, save_total_limit: int | None, config: dict[str, Any]):
        self.root, self.env, self.limit, self.config = Path(root), env, save_total_limit, config

    def save(
        self, step: int, model, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any, trainer_state: dict[str, Any]
    ) -> Path | None:
        rng_states = all_gather_object(capture_rng_state(), self.env)
        final = self.root / f"step-{step}"
        main = self.env.is_main
        if model.sharded:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.api import CheckpointException
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model_state, optim_state = get_state_dict(model.module, optimizer)
        else:
            model_state = model.full_state_dict()
            optim_state = optimizer.state_dict() if main else {}

        def needed() -> tuple[int, str]:
            published = list_checkpoints(self.root)
            return space_needed(published[-1] if published else None, (model_state, optim_state))

        # Two steps, so that no rank waits for the temp directory's name while rank 0 reports a failure to make it.
        with saving_together(self.env, final, self.root, needed):
            tmp = _fresh_tmp(final) if main else None
        tmp = broadcast_object(tmp, self.env)
        with saving_together(self.env, final, self.root, needed), _removed_on_failure(tmp if main else None):
            if model.sharded:
                try:
                    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp / SHARDED))
                except CheckpointException as exc:  # a BaseException, raised on every rank: made an error like the others
                    first = next(iter(exc.failures.values()))[0] if exc.failures else None
                    raise RuntimeError(f"torch.distributed.checkpoint could not save {tmp / SHARDED}") from (first or exc)
                barrier(self.env)  # every rank's shards are on disk before rank 0 seals the directory
            elif main:
                save_weights(model_state, tmp / "model.safetensors")
                torch.save(optim_state, tmp / "optimizer.pt")
            if main:
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
                if scaler is not None:
                    torch.save(scaler.state_dict(), tmp / "scaler.pt")
                torch.save(rng_states, tmp / "rng_state.pt")
                state = {**trainer_state, "global_step": step, "world_size": self.env.world_size, "sharded": bool(model.sharded)}
                (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
                (tmp / "config.json").write_text(json.dumps(self.config, indent=2))
                write_manifest(tmp, step)  # last: a checkpoint without one never finished
                _publish_dir(tmp, final)
        if not main:
            return None
        rotate_checkpoints(self.root, self.limit)
        return final

    def load(self, path: str | os.PathLike, model, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any) -> LoadedCheckpoint:
        path = Path(path)
        if (path / SHARDED).is_dir():
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            model_state, optim_state = get_state_dict(model.module, optimizer)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=str(path / SHARDED))  # reshards to this run's world size
            set_state_dict(model.module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        elif model.sharded:
            raise CheckpointError(f"{path} was written by a replicated run (ddp); resume it with --strategy ddp")
        else:
            load_weights(model.raw, path / "model.safetensors")
            optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        if scaler is not None and (path / "scaler.pt").is_file():
            scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
        rng = torch.load(path / "rng_state.pt", weights_only=True)
        return LoadedCheckpoint(json.loads((path / "trainer_state.json").read_text()), rng)


def load_sharded_weights(model: torch.nn.Module, directory: Path) -> None:
    """The model weights of a sharded checkpoint, consolidated in this one process (no process group)."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict()}
    # no_dist: this process alone, even inside a process group (e.g. rank 0 of an evaluation).
    dcp.load(state, checkpoint_id=str(directory / SHARDED), no_dist=True)
    model.load_state_dict(state["model"])


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Published ``step-N`` directories, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def rotate_checkpoints(root: str | os.PathLike, limit: int | None) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``; returns what was removed."""
    if limit is None:
        return []
    existing = list_checkpoints(root)
    doomed = existing[: max(0, len(existing) - limit)]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


# ------------------------------------------------------------------ integrity
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
    """Raise :class:`CheckpointError` naming the first file that is missing, truncated or altered."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: no {MANIFEST} (its save did not finish)")
    try:
        entries = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {path} is damaged: {manifest} cannot be read ({_first_line(exc)})") from None
    for name, entry in entries.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {f} is missing")
        size = f.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointError(f"checkpoint {path} is damaged: {f} has {size:,} bytes, {entry['bytes']:,} were written")
        if _sha256(f) != entry["sha256"]:
            raise CheckpointError(f"checkpoint {path} is damaged: {f} does not match its checksum")


def resolve_resume(spec: str | None, checkpoints: str | os.PathLike, warn=print) -> Path | None:
    """The checkpoint to continue from, verified against its manifest.

    ``auto``: the newest complete checkpoint in ``checkpoints`` (None when there is none); an
    incomplete or damaged newer one is skipped with one warning line. A path: that checkpoint,
    which must be complete (else :class:`CheckpointError` naming the bad file).
    """
    if spec is None:
        return None
    if spec == "auto":
        for path in reversed(list_checkpoints(checkpoints)):
            try:
                verify_checkpoint(path)
                return path
            except CheckpointError as exc:
                warn(f"warning: skipping {path.name}: {exc}; trying the one before")
        return None
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--resume {spec}: no such checkpoint directory; expected runs/<name>/checkpoints/step-N or 'auto'")
    verify_checkpoint(path)
    return path


# ------------------------------------------------------------------ servable checkpoints
def save_servable(
    directory: str | os.PathLike, model: torch.nn.Module, weights: dict[str, torch.Tensor], tokenizer, info: dict[str, Any]
) -> Path:
    """A Hugging Face ``save_pretrained`` folder plus ``distrinews.json`` (metrics, max_length, labels, config,
    model version and config hash) and ``README.md``, the model card.

    ``weights`` is the full state dict every rank gathered (``ParallelModel.full_state_dict``);
    ``model`` supplies the architecture's config and file layout.
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_tmp(final)
    with _removed_on_failure(tmp):
        # a copy: save_pretrained empties the dict it is given, and the caller may still need it
        model.save_pretrained(str(tmp), state_dict=dict(weights), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        payload = {"label_names": list(LABELS), "package_version": __version__, **version_fields(info), **info}
        (tmp / SERVABLE_INFO).write_text(json.dumps(payload, indent=2))
        write_model_card(tmp, payload)  # README.md: the Hub's model card, from the same payload
        _publish_dir(tmp, final)
    return final


# ------------------------------------------------------------------ the legacy single-file form
def export_legacy_pt(checkpoint: str | os.PathLike, out: str | os.PathLike, model_version: str | None = None) -> Path:
    """Write ``{epoch, model_state_dict, optimizer_state_dict, loss, accuracy, config}`` from a checkpoint dir.

    ``config`` also carries the model version (``model_version``, else the checkpoint's) and config hash.
    """
    model, tokenizer, info = load_for_inference(checkpoint)
    versions = version_fields({**info, "model_version": model_version or info.get("model_version")})
    ckpt = Path(checkpoint)
    optimizer_state: dict[str, Any] = {}
    if (ckpt / "optimizer.pt").is_file():
        optimizer_state = torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu")
    metrics = info.get("metrics", {})
    payload = {
        "epoch": info.get("epoch", 0),
        "model_state_dict": {k: v.contiguous() for k, v in model.state_dict().items()},
        "optimizer_state_dict": optimizer_state,
        "loss": metrics.get("loss"),
        "accuracy": None if metrics.get("accuracy") is None else 100.0 * metrics["accuracy"],
        "config": {
            "model_name": info.get("model_name", model.config.name_or_path),
            "num_labels": model.config.num_labels,
            "max_length": info.get("max_length", 128),
            "label_names": info.get("label_names", list(LABELS)),
            "hf_config": model.config.to_dict(),
            "tokenizer": tokenizer.name_or_path,
            "model_version": versions["model_version"],
            "config_hash": info.get("config_hash") or versions["config_hash"],
        },
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, out)
    return out


def _weights_file(directory: Path) -> Path:
    """The file a Hugging Face folder keeps its weights in (for messages), else the folder itself."""
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (directory / name).is_file():
            return directory / name
    return directory


def _base_model_of(directory: Path) -> str | None:
    """Where the base model that ``distrinews.json`` names loads from (our short names mapped to their path)."""
    info = _read_json(directory / SERVABLE_INFO) if (directory / SERVABLE_INFO).is_file() else {}
    name = info.get("model_name") if isinstance(info, dict) else None
    if name in (SHIPPED_MINILM, TINY_RANDOM):
        try:
            return resolve_model_path(name)
        except RuntimeError:  # its package is not installed here: the name alone
            pass
    return name


def _load_pretrained(path: Path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    require_tokenizer(path, _base_model_of(path))
    with _loading(_weights_file(path)):
        model = AutoModelForSequenceClassification.from_pretrained(str(path))
    with _loading(path):
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer


def _load_legacy_pt(path: Path):
    with _loading(path):
        payload = torch.load(path, weights_only=True, map_location="cpu")
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"could not load checkpoint {path}: not a DistriNews or legacy .pt checkpoint (it holds a {type(payload).__name__}, not a dict)"
        )
    missing = {"model_state_dict", "config"} - set(payload)
    if missing:
        raise CheckpointError(f"could not load checkpoint {path}: not a DistriNews or legacy .pt checkpoint (missing {sorted(missing)})")
    with _loading(path, also=(TypeError, AttributeError)):  # a payload of the wrong shape
        return _legacy_pt_model(path, payload)


def _legacy_pt_model(path: Path, payload: dict[str, Any]):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = payload["config"]
    hf_config = dict(cfg.get("hf_config") or {})
    if hf_config:
        model_type = hf_config.pop("model_type")
        config = AutoConfig.for_model(model_type, **hf_config)
    else:  # the reference system's own file: only the hub name is known
        config = AutoConfig.from_pretrained(cfg["model_name"], num_labels=cfg.get("num_labels", len(LABELS)))
    labels = list(cfg.get("label_names") or LABELS)
    config.id2label = dict(enumerate(labels))
    config.label2id = {n: i for i, n in enumerate(labels)}
    model = AutoModelForSequenceClassification.from_config(config)
    state = payload["model_state_dict"]
    if all(k.startswith("model.") for k in state):  # the reference system wrapped the HF model as `self.model`
        state = {k[len("model.") :]: v for k, v in state.items()}
    model.load_state_dict(state, strict=False)
    tokenizer, tokenizer_source = _legacy_tokenizer(path, cfg)
    info = {
        "epoch": payload.get("epoch"),
        "metrics": {"loss": payload.get("loss"), "accuracy": None if payload.get("accuracy") is None else payload["accuracy"] / 100.0},
        "max_length": cfg.get("max_length", 128),
        "label_names": labels,
        "model_name": cfg.get("model_name"),
        "model_version": cfg.get("model_version"),
        "config_hash": cfg.get("config_hash"),
        "format": "pt",
        "tokenizer": tokenizer_source,
    }
    return model, tokenizer, info


def _legacy_tokenizer(path: Path, cfg: dict[str, Any]):
    """(tokenizer, where it came from): a ``.pt`` file holds none, so the tokenizer directory its config
    records if that still holds one, else the base model's. Said in one warning either way, since the
    predictions are only right with the tokenizer the model was trained with."""
    from transformers import AutoTokenizer

    recorded = cfg.get("tokenizer")
    if recorded and Path(recorded).is_dir() and has_tokenizer(recorded):
        tokenizer, source = AutoTokenizer.from_pretrained(recorded), {"source": "recorded_path", "path": str(recorded)}
        where = f"the tokenizer at {recorded}, which its config names"
    else:
        name = cfg.get("model_name") or recorded
        tokenizer, source = build_tokenizer(name), {"source": "base_model", "name": name}
        where = f"the tokenizer of its base model {name}"
    log.warning("%s is a single-file checkpoint with no tokenizer in it: using %s", path, where)
    return tokenizer, source


def check_loadable(path: str | os.PathLike) -> None:
    """A cheap look at a checkpoint before a server starts: the weights' header (safetensors) or the
    pickle (``weights_only=True``, memory-mapped, so no tensor is read) and the JSON files parse.
    Raises :class:`CheckpointError` (one line naming the file) or ``FileNotFoundError``; runs nothing."""
    import zipfile

    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_file():
        with _loading(path):
            torch.load(path, weights_only=True, map_location="cpu", mmap=zipfile.is_zipfile(path))
        return
    if not (path / "config.json").is_file() and not (path / "trainer_state.json").is_file():
        raise CheckpointError(f"could not load checkpoint {path}: not a checkpoint (no config.json, trainer_state.json, or .pt file)")
    for name in ("config.json", SERVABLE_INFO, "trainer_state.json"):
        if (path / name).is_file():
            _read_json(path / name)
    if needs_own_tokenizer(path):
        require_tokenizer(path, _base_model_of(path))
    for weights in sorted(path.glob("*.safetensors")):
        with _loading(weights), safe_open(str(weights), framework="pt") as fh:
            fh.keys()


def load_for_inference(path: str | os.PathLike):
    """(model in eval mode, tokenizer, info) from a ``best/``-style directory, a ``step-N`` directory or a ``.pt`` file.

    A checkpoint that exists but cannot be loaded raises :class:`CheckpointError` (one line
    naming the file and why); a path that does not exist raises ``FileNotFoundError``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_file():
        model, tokenizer, info = _load_legacy_pt(path)
    elif (path / "config.json").is_file() and (path / SERVABLE_INFO).is_file():
        info = {**_read_json(path / SERVABLE_INFO), "format": "pretrained", "tokenizer": {"source": "checkpoint", "path": str(path)}}
        model, tokenizer = _load_pretrained(path)
    elif (path / "trainer_state.json").is_file():
        # A resumable checkpoint: rebuild the architecture from the run's config, then load weights.
        # Only the fields that define the architecture are read, so checkpoints of other versions load too.
        from .model import add_lora, build_model

        values, state = _read_json(path / "config.json"), _read_json(path / "trainer_state.json")
        name = values.get("model_name_or_path", "minilm")
        model = build_model(name, dropout=values.get("dropout"), seed=values.get("seed", 42))
        if values.get("use_peft"):
            model = add_lora(model, values.get("lora_r", 16), values.get("lora_alpha", 32), 0.0, values.get("lora_target_modules"))
        if (path / SHARDED).is_dir():
            with _loading(path / SHARDED):
                load_sharded_weights(model, path)
        else:
            with _loading(path / "model.safetensors"):
                load_weights(model, path / "model.safetensors")
        tokenizer = build_tokenizer(name)
        info = {
            "epoch": state.get("epoch"),
            "metrics": state.get("last_eval", {}),
            "max_length": values.get("max_length", 128),
            "label_names": list(LABELS),
            "model_name": name,
            "format": "resumable",
            # A resumable checkpoint tokenizes with the base model its training config names.
            "tokenizer": {"source": "base_model", "name": name},
        }
    elif (path / "config.json").is_file():  # any HF sequence-classification folder
        model, tokenizer = _load_pretrained(path)
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        info = {"label_names": labels, "max_length": 128, "format": "pretrained", "tokenizer": {"source": "checkpoint", "path": str(path)}}
    else:
        raise CheckpointError(f"{path}: not a checkpoint (no config.json, trainer_state.json, or .pt file)")
    model = merged(model)  # a resumable LoRA checkpoint: adapters folded in for inference
    model.eval()
    return model, tokenizer, info

"""Knowledge distillation: the student learns the teacher's soft labels as well as the true ones.

    loss = alpha x CE(student, label) + (1 - alpha) x T^2 x KL(teacher_T || student_T)

where ``_T`` is a distribution softened at temperature ``T`` (Hinton et al.; the T^2 keeps the soft term's gradients
at the hard term's scale). The teacher is one checkpoint or several (an ensemble, ``predict.ensemble``).

The teacher's log-probabilities of every training row are computed once, before training, by each node's first
process, and cached as ``teacher-KEY.safetensors`` (KEY hashes the teachers' files, the rows and the label order);
the other processes wait at a barrier and read it. Each batch carries its rows' indices (``data.collate``), by which
the loss looks the teacher's rows up. A file that is not what its name promises (shape, dtype, values that are not
log-probabilities) is never trusted: the first process computes it again, the others refuse it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from ..checkpoint.atomic import open_nofollow
from ..config import TrainConfig
from ..data.cache_dir import default_cache_dir
from ..data.rows import RawSplit
from ..distributed.process_group import DistEnv, main_process_first
from ..errors import ConfigError

CACHE_VERSION = "teacher-v1"
HEADER_LIMIT = 1 << 16  # bytes a cache file may hold beyond its tensor (safetensors' JSON header)
FIELD = "teacher_model_name_or_path"


class TeacherCacheError(ValueError):
    """A cached teacher file that is not what its name promises."""


def teacher_paths(spec: str) -> list[Path]:
    """The checkpoints ``teacher_model_name_or_path`` names (comma-separated), each of which must exist."""
    paths = [Path(p.strip()).expanduser() for p in spec.split(",") if p.strip()]
    if not paths:
        raise ConfigError(f"config field '{FIELD}': names no checkpoint")
    for path in paths:
        if not path.exists():
            raise ConfigError(
                f"config field '{FIELD}': {path} does not exist (a checkpoint directory, e.g. runs/NAME/best)"
            )
    return paths


def soft_loss(student_logits: torch.Tensor, teacher_log_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """T^2 x KL(teacher_T || student_T), averaged over the rows, in fp32."""
    student = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_log_probs.float() / temperature, dim=-1)
    return F.kl_div(student, teacher, reduction="batchmean", log_target=True) * temperature**2


class Distillation:
    """The teacher's log-probabilities of the training rows (on the device) and the loss that mixes them in."""

    def __init__(self, log_probs: torch.Tensor, temperature: float, alpha: float):
        self.log_probs, self.temperature, self.alpha = log_probs, temperature, alpha

    def loss(self, hard: torch.Tensor, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``hard``, the batch's cross-entropy, mixed with the soft loss against its rows' teacher probabilities."""
        soft = soft_loss(logits, self.log_probs[batch["index"]], self.temperature)
        return self.alpha * hard + (1.0 - self.alpha) * soft

    @classmethod
    def prepare(
        cls, config: TrainConfig, rows: RawSplit, labels: list[str], env: DistEnv, say: Callable[..., None]
    ) -> Distillation:
        """The teacher's log-probabilities of ``rows`` (the training split, in its dataset's order), cached."""
        teacher = config.distillation
        assert teacher.teacher_model_name_or_path is not None, "prepared only for a run with a teacher"
        paths = teacher_paths(teacher.teacher_model_name_or_path)
        started = time.perf_counter()
        with main_process_first(env, local=True):
            log_probs, computed = cached_log_probs(
                paths, rows, labels, config.data.cache_dir, build=env.is_local_main, device=env.device
            )
        what, took = "computed" if computed else "read from the cache", time.perf_counter() - started
        say(f"Teacher:     {len(paths)} checkpoint(s), {len(rows):,} rows' probabilities {what} in {took:.1f} s")
        return cls(log_probs.to(env.device), teacher.distillation_temperature, teacher.distillation_alpha)


# ---------------------------------------------------------------------- the cache
def _hash_path(h: hashlib._Hash, path: Path) -> None:
    """A checkpoint file's bytes, or a directory's files (a link as its target's name, not followed); not ONNX files,
    which the PyTorch predictor does not read and serving adds later."""
    if path.is_symlink():
        h.update(f"link|{path.name}|{os.readlink(path)}|".encode())
        return
    if path.is_file():
        h.update(f"file|{path.name}|".encode())
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return
    for child in sorted(path.iterdir()):
        if child.suffix != ".onnx":
            h.update(f"entry|{child.name}|".encode())
            _hash_path(h, child)


def cache_path(paths: list[Path], rows: RawSplit, labels: list[str], cache_dir: str | os.PathLike[str] | None) -> Path:
    h = hashlib.sha256(f"{CACHE_VERSION}|{len(paths)}|{'|'.join(labels)}|".encode())
    for path in paths:
        _hash_path(h, path)
    for text, label in zip(rows.texts, rows.labels):
        h.update(f"{label}\x1e{text}\x1f".encode())
    return (Path(cache_dir) if cache_dir else default_cache_dir()) / f"teacher-{h.hexdigest()[:24]}.safetensors"


def read_cached(path: Path, rows: int, classes: int) -> torch.Tensor:
    """The [rows, classes] float32 log-probabilities in ``path``, read without following a link and within the size
    that shape allows; ``TeacherCacheError`` for anything else."""
    limit = rows * classes * 4 + HEADER_LIMIT
    try:  # a link, a FIFO (never waited on) or anything but a regular file is refused
        fd = open_nofollow(path, os.O_RDONLY)
    except ConfigError as exc:  # its message names the path and why
        raise TeacherCacheError(str(exc)) from None
    except OSError as exc:
        raise TeacherCacheError(f"{path}: cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise TeacherCacheError(f"{path}: over the {limit:,} bytes its shape allows")
        data = fh.read(limit + 1)
    try:
        tensors = load_safetensors(data)
    except Exception as exc:  # safetensors raises its own error types for a malformed file
        raise TeacherCacheError(f"{path}: not a safetensors file ({type(exc).__name__}: {exc})") from None
    t = tensors.get("log_probs")
    if t is None or set(tensors) != {"log_probs"} or t.dtype != torch.float32 or tuple(t.shape) != (rows, classes):
        got = {k: (str(v.dtype), tuple(v.shape)) for k, v in tensors.items()}
        raise TeacherCacheError(f"{path}: holds {got}, not log_probs float32 of shape ({rows}, {classes})")
    if not torch.isfinite(t).all() or (torch.logsumexp(t.double(), dim=-1).abs() > 1e-3).any():
        raise TeacherCacheError(f"{path}: its rows are not log-probabilities (finite, each summing to probability 1)")
    return t


def cached_log_probs(
    paths: list[Path],
    rows: RawSplit,
    labels: list[str],
    cache_dir: str | os.PathLike[str] | None,
    build: bool,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, bool]:
    """(the teachers' [N, C] log-probabilities of ``rows``, whether they were computed now); a missing or unreadable
    cache file is computed and written atomically with ``build``, an error without."""
    path = cache_path(paths, rows, labels, cache_dir)
    if path.exists() or path.is_symlink():
        try:
            return read_cached(path, len(rows), len(labels)), False
        except TeacherCacheError as exc:
            if not build:
                raise
            print(f"warning: {exc}; computing the teacher's probabilities again", flush=True)
    elif not build:
        raise FileNotFoundError(f"teacher cache {path} was not written by the node's first process")
    from ..predict.ensemble import ensemble_log_probs

    out = ensemble_log_probs(paths, rows.texts, labels, device=device)
    log_probs = torch.from_numpy(out.log_probs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(
        {"log_probs": log_probs}, str(tmp), metadata={"teachers": ",".join(map(str, paths)), "rows": str(len(rows))}
    )
    os.replace(tmp, path)  # a link planted at ``path`` is replaced, not followed
    return log_probs, True

"""Checkpoints: resumable ``checkpoints/step-N/``, servable ``best/``, and the seed's single ``.pt`` file.

Every directory is written under a temporary name and moved into place with ``os.replace``,
so a kill mid-save leaves the previous checkpoint whole. Tensors are stored as safetensors;
whatever goes through ``torch.load`` is loaded with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from . import __version__
from .model import LABELS, build_tokenizer

STEP_DIR = re.compile(r"^step-(\d+)$")
SERVABLE_INFO = "distrinews.json"


# ------------------------------------------------------------------ atomic directories
def _fresh_tmp(final: Path) -> Path:
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    return tmp


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


def clean_stale_tmp(directory: Path) -> None:
    """Remove leftovers of saves that were killed midway (never a published checkpoint)."""
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)


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
def save_resumable(
    root: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    trainer_state: dict[str, Any],
    rng_states: list[dict[str, Any]],
    config: dict[str, Any],
) -> Path:
    """Write ``root/step-N`` (call on the main process only; ``model`` is the unwrapped module)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = _fresh_tmp(final)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    if scaler is not None:
        torch.save(scaler.state_dict(), tmp / "scaler.pt")
    torch.save(rng_states, tmp / "rng_state.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "global_step": step}, indent=2))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    _publish_dir(tmp, final)
    return final


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


def resolve_resume(spec: str | None, output_dir: str | os.PathLike) -> Path | None:
    """``auto`` = the newest checkpoint of this run (None if there is none yet); else a path that must exist."""
    if spec is None:
        return None
    if spec == "auto":
        found = list_checkpoints(Path(output_dir) / "checkpoints")
        return found[-1] if found else None
    path = Path(spec)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"--resume {spec}: not a checkpoint directory (no trainer_state.json); expected runs/<name>/checkpoints/step-N or 'auto'")
    return path


def load_resumable(path: str | os.PathLike, model, optimizer, scheduler, scaler) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    path = Path(path)
    load_model(model, str(path / "model.safetensors"), device=str(next(model.parameters()).device))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if scaler is not None and (path / "scaler.pt").is_file():
        scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
    rng = torch.load(path / "rng_state.pt", weights_only=True)
    state = json.loads((path / "trainer_state.json").read_text())
    return state, rng


# ------------------------------------------------------------------ servable checkpoints
def save_servable(directory: str | os.PathLike, model: torch.nn.Module, tokenizer, info: dict[str, Any]) -> Path:
    """A Hugging Face ``save_pretrained`` folder plus ``distrinews.json`` (metrics, max_length, labels, config)."""
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_tmp(final)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    payload = {"label_names": list(LABELS), "package_version": __version__, **info}
    (tmp / SERVABLE_INFO).write_text(json.dumps(payload, indent=2))
    _publish_dir(tmp, final)
    return final


# ------------------------------------------------------------------ the seed's single-file form
def export_seed_pt(checkpoint: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write ``{epoch, model_state_dict, optimizer_state_dict, loss, accuracy, config}`` from a checkpoint dir."""
    model, tokenizer, info = load_for_inference(checkpoint)
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
        },
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, out)
    return out


def _load_seed_pt(path: Path):
    payload = torch.load(path, weights_only=True, map_location="cpu")
    missing = {"model_state_dict", "config"} - set(payload)
    if missing:
        raise ValueError(f"{path}: not a DistriNews/seed checkpoint (missing {sorted(missing)})")
    cfg = payload["config"]
    hf_config = dict(cfg.get("hf_config") or {})
    if hf_config:
        model_type = hf_config.pop("model_type")
        config = AutoConfig.for_model(model_type, **hf_config)
    else:  # the seed's own file: only the hub name is known
        config = AutoConfig.from_pretrained(cfg["model_name"], num_labels=cfg.get("num_labels", len(LABELS)))
    labels = list(cfg.get("label_names") or LABELS)
    config.id2label = dict(enumerate(labels))
    config.label2id = {n: i for i, n in enumerate(labels)}
    model = AutoModelForSequenceClassification.from_config(config)
    state = payload["model_state_dict"]
    if all(k.startswith("model.") for k in state):  # the seed wrapped the HF model as `self.model`
        state = {k[len("model."):]: v for k, v in state.items()}
    model.load_state_dict(state, strict=False)
    tok_name = cfg.get("tokenizer") or cfg["model_name"]
    tokenizer = AutoTokenizer.from_pretrained(tok_name) if Path(tok_name).exists() else build_tokenizer(cfg.get("model_name", tok_name))
    info = {
        "epoch": payload.get("epoch"),
        "metrics": {"loss": payload.get("loss"), "accuracy": None if payload.get("accuracy") is None else payload["accuracy"] / 100.0},
        "max_length": cfg.get("max_length", 128),
        "label_names": labels,
        "model_name": cfg.get("model_name"),
        "format": "pt",
    }
    return model, tokenizer, info


def load_for_inference(path: str | os.PathLike):
    """(model in eval mode, tokenizer, info) from a ``best/``-style directory, a ``step-N`` directory or a ``.pt`` file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_file():
        model, tokenizer, info = _load_seed_pt(path)
    elif (path / "config.json").is_file() and (path / SERVABLE_INFO).is_file():
        model = AutoModelForSequenceClassification.from_pretrained(str(path))
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        info = {**json.loads((path / SERVABLE_INFO).read_text()), "format": "pretrained"}
    elif (path / "trainer_state.json").is_file():
        # A resumable checkpoint: rebuild the architecture from the run's config, then load weights.
        from .config import TrainConfig
        from .model import build_model

        cfg = TrainConfig.from_dict(json.loads((path / "config.json").read_text()))
        model = build_model(cfg.model_name_or_path, dropout=cfg.dropout, seed=cfg.seed)
        load_model(model, str(path / "model.safetensors"))
        tokenizer = build_tokenizer(cfg.model_name_or_path)
        state = json.loads((path / "trainer_state.json").read_text())
        info = {"epoch": state.get("epoch"), "metrics": state.get("last_eval", {}), "max_length": cfg.max_length,
                "label_names": list(LABELS), "model_name": cfg.model_name_or_path, "format": "resumable"}
    elif (path / "config.json").is_file():  # any HF sequence-classification folder
        model = AutoModelForSequenceClassification.from_pretrained(str(path))
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        info = {"label_names": labels, "max_length": 128, "format": "pretrained"}
    else:
        raise ValueError(f"{path}: not a checkpoint (no config.json, trainer_state.json, or .pt file)")
    model.eval()
    return model, tokenizer, info

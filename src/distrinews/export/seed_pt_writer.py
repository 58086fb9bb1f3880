"""Export a checkpoint as the single ``.pt`` file the reference system (``../shared/seeds``) saved.

The form: ``{epoch, model_state_dict, optimizer_state_dict, loss, accuracy, config}``; ``config``
also carries the model version and config hash, so the file says which model it is.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.servable import load_for_inference
from ..checkpoint.versioning import version_fields
from ..model import hf_config


def export_seed_pt(
    checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], model_version: str | None = None
) -> Path:
    """Write ``out`` from a checkpoint folder; the version is ``model_version``, else the checkpoint's."""
    model, tokenizer, info = load_for_inference(checkpoint)
    versions = version_fields(info.training_config, model_version or info.model_version)
    ckpt = Path(checkpoint)
    optimizer_state: dict[str, Any] = {}
    if (ckpt / "optimizer.pt").is_file():
        optimizer_state = torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu")
    metrics = info.metrics
    model_config = hf_config(model)
    payload = {
        "epoch": 0 if info.epoch is None else info.epoch,  # the reference format's epoch is a number
        "model_state_dict": {k: v.contiguous() for k, v in model.state_dict().items()},
        "optimizer_state_dict": optimizer_state,
        "loss": metrics.get("loss"),
        "accuracy": None if metrics.get("accuracy") is None else 100.0 * metrics["accuracy"],
        "config": {
            "model_name": info.model_name or model_config.name_or_path,
            "num_labels": model_config.num_labels,
            "max_length": info.max_length,
            "label_names": list(info.label_names),
            "hf_config": model_config.to_dict(),
            "tokenizer": tokenizer.name_or_path,
            "model_version": versions["model_version"],
            "config_hash": info.config_hash or versions["config_hash"],
            "temperature": info.temperature,  # the logits' divisor before the softmax (train/calibration.py)
        },
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, out)
    return out

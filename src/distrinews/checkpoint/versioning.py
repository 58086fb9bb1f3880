"""What names a trained model: its version (``MAJOR.MINOR.PATCH``) and the fingerprint of the config that trained it.

The reference system names its artifacts by version (``distilbert_agnews_v1.0.0.pt``). Here the version is the config
field ``model_version``, stamped with ``config_hash`` into ``best/distrinews.json`` and the model card (``distrinews
export --version`` restamps an export). The hash says whether two models came from the same recipe: every field of
the resolved config but those that only say where a run writes and how it reports.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from ..config import DEFAULT_MODEL_VERSION as DEFAULT_MODEL_VERSION  # re-exported: the version is named here
from ..config import is_version as is_version

# Fields that do not change the trained model: where it is written, resumed from, and how it is reported.
NOT_HASHED = frozenset(
    {
        "output_dir",
        "resume_from_checkpoint",
        "overwrite_output_dir",
        "disable_tqdm",
        "report_to",
        "cache_dir",
        "model_version",
    }
)
# Hub ids whose names carry a size/casing suffix the reference system's file names leave out.
_NAME_SUFFIXES = ("-base-uncased", "-base-cased", "-uncased", "-cased")


def config_hash(training_config: dict[str, Any]) -> str:
    """The first 12 hex digits of sha256 over the config as canonical JSON, without ``NOT_HASHED``."""
    kept = {k: v for k, v in training_config.items() if k not in NOT_HASHED}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def version_fields(training_config: dict[str, Any] | None, model_version: str | None = None) -> dict[str, Any]:
    """``model_version`` (given, else the training config's, else the default) and ``config_hash`` (None: the
    weights did not come from a training run) for a servable checkpoint's ``distrinews.json``."""
    training = training_config or {}
    version = model_version or training.get("model_version") or DEFAULT_MODEL_VERSION
    return {"model_version": version, "config_hash": config_hash(training) if training else None}


def short_model_name(model_name: str | None) -> str:
    """``distilbert-base-uncased`` -> ``distilbert``, ``org/My_Model`` -> ``my-model``: a file-name-safe stem."""
    name = (model_name or "model").rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in _NAME_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return re.sub(r"[^a-z0-9.-]+", "-", name).strip("-.") or "model"


def artifact_name(model_name: str | None, version: str, suffix: str = ".pt") -> str:
    """The reference system's versioned file name: ``<model>_agnews_v<version><suffix>``."""
    return f"{short_model_name(model_name)}_agnews_v{version}{suffix}"

"""The single-file ``.pt`` checkpoint the reference system (``../shared/seeds``) saved, loaded for inference.

Its form: ``{epoch, model_state_dict, optimizer_state_dict, loss, accuracy, config}``. It holds no tokenizer, so the
one it was trained with is found among files already here (never the hub) and named in the log and ``ModelInfo``.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import TypeAdapter, ValidationError

from ..config import field_default
from ..data.rows import AG_NEWS_LABELS as LABELS
from ..errors import CheckpointError
from ..model import build_tokenizer
from .load_errors import loading
from .records import CheckpointFormat, ModelInfo, Temperature, TokenizerSource, expected
from .tokenizer_files import has_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def read_seed_pt(found: CheckpointFormat) -> Callable[[], tuple[Any, Any, ModelInfo]]:
    """The file checked (read weights-only and memory-mapped, so no tensor is read yet: a dict that holds the
    weights and the config), then what loads the model from it."""
    path = found.path
    with loading(path):
        payload = torch.load(path, weights_only=True, map_location="cpu", mmap=zipfile.is_zipfile(path))
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"could not load checkpoint {path}: not a DistriNews or legacy "
            f".pt checkpoint (it holds a {type(payload).__name__}, not a dict)"
        )
    missing = {"model_state_dict", "config"} - set(payload)
    if missing:
        raise CheckpointError(
            f"could not load checkpoint {path}: not a DistriNews or legacy .pt checkpoint (missing {sorted(missing)})"
        )

    def load() -> tuple[Any, Any, ModelInfo]:
        with loading(path, also=(TypeError, AttributeError)):  # a payload of the wrong shape
            return _seed_pt_model(path, payload)

    return load


def _seed_pt_model(path: Path, payload: dict[str, Any]) -> tuple[PreTrainedModel, Any, ModelInfo]:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = payload["config"]
    hf_config = dict(cfg.get("hf_config") or {})
    if hf_config:
        model_type = hf_config.pop("model_type")
        config = AutoConfig.for_model(model_type, **hf_config)
    else:  # the reference system's own file: only the hub name is known, read from files already here
        config = AutoConfig.from_pretrained(
            cfg["model_name"], num_labels=cfg.get("num_labels", len(LABELS)), local_files_only=True
        )
    labels = list(cfg.get("label_names") or LABELS)
    config.id2label = dict(enumerate(labels))
    config.label2id = {n: i for i, n in enumerate(labels)}
    model = AutoModelForSequenceClassification.from_config(config)
    state = payload["model_state_dict"]
    if all(k.startswith("model.") for k in state):  # the reference system wrapped the HF model as `self.model`
        state = {k[len("model.") :]: v for k, v in state.items()}
    model.load_state_dict(state, strict=False)
    tokenizer, tokenizer_source = _legacy_tokenizer(path, cfg)
    info = ModelInfo(
        label_names=labels,
        epoch=payload.get("epoch"),
        metrics={
            "loss": payload.get("loss"),
            "accuracy": None if payload.get("accuracy") is None else payload["accuracy"] / 100.0,
        },
        max_length=cfg["max_length"] if "max_length" in cfg else field_default("max_length"),
        model_name=cfg.get("model_name"),
        model_version=cfg.get("model_version"),
        config_hash=cfg.get("config_hash"),
        temperature=_temperature(path, cfg.get("temperature", 1.0)),
        checkpoint_format="pt",
        tokenizer=tokenizer_source,
    )
    return model, tokenizer, info


def _temperature(path: Path, value: Any) -> float:
    """The file's calibration temperature (1: the seed's files, which have none); anything out of range is refused."""
    try:
        return float(TypeAdapter(Temperature).validate_python(value, strict=True))
    except ValidationError:
        raise CheckpointError(
            f"could not load checkpoint {path}: config key 'temperature' must be {expected(Temperature)}, "
            f"not {value!r:.40}"
        ) from None


def _legacy_tokenizer(path: Path, cfg: dict[str, Any]) -> tuple[Any, TokenizerSource]:
    """(tokenizer, where it came from): the directory its config records if that still holds one, else the base
    model's; said in one warning either way (predictions are only right with the tokenizer it was trained with)."""
    from transformers import AutoTokenizer

    recorded = cfg.get("tokenizer")
    tokenizer: PreTrainedTokenizerBase | None
    if recorded and Path(recorded).is_dir() and has_tokenizer(recorded):
        tokenizer = AutoTokenizer.from_pretrained(recorded, local_files_only=True)
        source = TokenizerSource("recorded_path", str(recorded))
        where = f"the tokenizer at {recorded}, which its config names"
    else:
        name = cfg.get("model_name") or recorded
        if not name:
            raise CheckpointError(
                f"could not load checkpoint {path}: its config names neither a base model nor a tokenizer"
            )
        tokenizer, source = build_tokenizer(name, local_files_only=True), TokenizerSource("base_model", name=name)
        where = f"the tokenizer of its base model {name}"
    log.warning("%s is a single-file checkpoint with no tokenizer in it: using %s", path, where)
    return tokenizer, source

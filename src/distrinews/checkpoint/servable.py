"""The servable checkpoint, ``best/``: a Hugging Face folder plus ``distrinews.json`` and the model card,
and loading any checkpoint (``best/``, ``step-N`` or a legacy ``.pt``) for inference.

``distrinews.json`` is a :class:`~.records.ServableInfo`; what ``load_for_inference`` says about the
model it loaded is a :class:`~.records.ModelInfo` (``records.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from .. import __version__
from ..config import field_default
from ..errors import CheckpointError
from ..model import SHIPPED_MINILM, TINY_RANDOM, build_tokenizer, merged, resolve_model_path
from .atomic import fresh_tmp, publish_dir, removed_on_failure
from .load_errors import loading, read_json
from .manifest import verify_checkpoint
from .modelcard import write_model_card
from .records import SERVABLE_INFO, TRAINER_STATE, ModelInfo, ServableInfo, TokenizerSource, TrainerStateRecord
from .resumable import SHARDED, load_sharded_weights, load_weights
from .seed_pt import load_seed_pt
from .tokenizer_files import needs_own_tokenizer, require_tokenizer
from .versioning import version_fields

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def stamped(info: ServableInfo) -> ServableInfo:
    """``info`` as ``distrinews.json`` records it: the package version, the model version and the config hash
    (``versioning.version_fields``), each unless ``info`` gives it."""
    versions = version_fields(info.training_config, info.model_version)
    return replace(
        info,
        package_version=info.package_version or __version__,
        model_version=versions["model_version"],
        config_hash=versions["config_hash"] if info.config_hash is None else info.config_hash,
    )


def save_servable(
    directory: str | os.PathLike,
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    tokenizer,
    info: ServableInfo,
) -> Path:
    """A Hugging Face ``save_pretrained`` folder plus ``distrinews.json`` (``info``, stamped with the package
    version, model version and config hash) and ``README.md``, the model card.

    ``weights`` is the full state dict every rank gathered (``ParallelModel.full_state_dict``);
    ``model`` supplies the architecture's config and file layout.
    """
    if not isinstance(info, ServableInfo):
        raise TypeError(
            f"save_servable takes a ServableInfo (distrinews.checkpoint.records), not {type(info).__name__}"
        )
    info = stamped(info)
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = fresh_tmp(final)
    with removed_on_failure(tmp):
        # a copy: save_pretrained empties the dict it is given, and the caller may still need it
        cast("PreTrainedModel", model).save_pretrained(str(tmp), state_dict=dict(weights), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / SERVABLE_INFO).write_text(json.dumps(info.to_json(), indent=2))
        write_model_card(tmp, info)  # README.md: the Hub's model card, from the same record
        publish_dir(tmp, final)
    return final


def _weights_file(directory: Path) -> Path:
    """The file a Hugging Face folder keeps its weights in (for messages), else the folder itself."""
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (directory / name).is_file():
            return directory / name
    return directory


def read_servable_info(directory: Path) -> ServableInfo:
    """``directory/distrinews.json``, parsed and checked (a one-line :class:`CheckpointError` otherwise)."""
    return ServableInfo.from_json(read_json(directory / SERVABLE_INFO), directory / SERVABLE_INFO)


def read_trainer_state(directory: Path) -> TrainerStateRecord:
    """``directory/trainer_state.json``, parsed and checked (a one-line :class:`CheckpointError` otherwise)."""
    return TrainerStateRecord.from_json(read_json(directory / TRAINER_STATE), directory / TRAINER_STATE)


def _base_model_of(directory: Path) -> str | None:
    """Where the base model that ``distrinews.json`` names loads from (our short names mapped to their path)."""
    name = read_servable_info(directory).model_name if (directory / SERVABLE_INFO).is_file() else None
    if name in (SHIPPED_MINILM, TINY_RANDOM):
        try:
            return resolve_model_path(name)
        except RuntimeError:  # its package is not installed here: the name alone
            pass
    return name


def _load_pretrained(path: Path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    require_tokenizer(path, _base_model_of(path))
    with loading(_weights_file(path)):
        model = AutoModelForSequenceClassification.from_pretrained(str(path))
    with loading(path):
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer


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
        with loading(path):
            torch.load(path, weights_only=True, map_location="cpu", mmap=zipfile.is_zipfile(path))
        return
    if not (path / "config.json").is_file() and not (path / TRAINER_STATE).is_file():
        raise CheckpointError(
            f"could not load checkpoint {path}: not a checkpoint (no config.json, trainer_state.json, or .pt file)"
        )
    if (path / TRAINER_STATE).is_file():
        verify_checkpoint(path)  # a step-N: every file as its save wrote it, the sharded metadata safe to read
    if (path / "config.json").is_file():
        read_json(path / "config.json")
    if (path / SERVABLE_INFO).is_file():
        read_servable_info(path)  # and its format version, keys and types
    if (path / TRAINER_STATE).is_file():
        read_trainer_state(path)
    if needs_own_tokenizer(path):
        require_tokenizer(path, _base_model_of(path))
    for weights in sorted(path.glob("*.safetensors")):
        with loading(weights), safe_open(str(weights), framework="pt") as fh:
            fh.keys()


def load_for_inference(path: str | os.PathLike) -> tuple[torch.nn.Module, Any, ModelInfo]:
    """(model in eval mode, tokenizer, :class:`~.records.ModelInfo`) from a ``best/``-style directory, a ``step-N``
    directory, a ``.pt`` file or any Hugging Face sequence-classification folder.

    A checkpoint that exists but cannot be loaded raises :class:`CheckpointError` (one line
    naming the file and why); a path that does not exist raises ``FileNotFoundError``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.is_file():
        model, tokenizer, info = load_seed_pt(path)
    elif (path / "config.json").is_file() and (path / SERVABLE_INFO).is_file():
        info = ModelInfo.of(
            read_servable_info(path), checkpoint_format="pretrained", tokenizer=TokenizerSource.checkpoint(path)
        )
        model, tokenizer = _load_pretrained(path)
    elif (path / TRAINER_STATE).is_file():
        # A resumable checkpoint: rebuild the architecture from the run's config, then load weights.
        # Only the fields that define the architecture are read, so checkpoints of other versions load too;
        # a field the config lacks takes TrainConfig's default.
        from ..model import add_lora, build_model

        verify_checkpoint(path)  # before any of its files is parsed
        values, state = read_json(path / "config.json"), read_trainer_state(path)

        def setting(key: str):
            return values[key] if key in values else field_default(key)

        name = setting("model_name_or_path")
        labels = list(state.label_names)
        model = build_model(name, labels=labels, dropout=setting("dropout"), seed=setting("seed"))
        if setting("use_peft"):
            model = add_lora(model, setting("lora_r"), setting("lora_alpha"), 0.0, setting("lora_target_modules"))
        if (path / SHARDED).is_dir():
            with loading(path / SHARDED):
                load_sharded_weights(model, path)
        else:
            with loading(path / "model.safetensors"):
                load_weights(model, path / "model.safetensors")
        tokenizer = build_tokenizer(name)
        info = ModelInfo(
            label_names=labels,
            epoch=state.epoch,
            metrics=state.last_eval,
            max_length=setting("max_length"),
            model_name=name,
            training_config=values,
            checkpoint_format="resumable",
            # A resumable checkpoint tokenizes with the base model its training config names.
            tokenizer=TokenizerSource.base_model(name),
        )
    elif (
        path / "config.json"
    ).is_file():  # any HF sequence-classification folder: its labels, TrainConfig's max_length
        model, tokenizer = _load_pretrained(path)
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        info = ModelInfo(label_names=labels, checkpoint_format="pretrained", tokenizer=TokenizerSource.checkpoint(path))
    else:
        raise CheckpointError(f"{path}: not a checkpoint (no config.json, trainer_state.json, or .pt file)")
    model = merged(model)  # a resumable LoRA checkpoint: adapters folded in for inference
    model.eval()
    return model, tokenizer, info

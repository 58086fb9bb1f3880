"""The servable checkpoint, ``best/``: a Hugging Face folder plus ``distrinews.json`` and the model card,
and loading any checkpoint (``best/``, ``step-N``, the seed's ``.pt``) for inference: its format recognised
once (``records.recognise``), then read by that format's reader, which makes every check of the format
before it returns what loads the model.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..config import field_default
from ..errors import CheckpointError
from ..model import SHIPPED_MINILM, TINY_RANDOM, build_tokenizer, label_fields, merged, resolve_model_path
from ..version import __version__
from . import records
from .atomic import fresh_tmp, publish_dir, removed_on_failure
from .load_errors import loading
from .manifest import verify_checkpoint
from .modelcard import write_model_card
from .pointers import refuse_pointers
from .records import SERVABLE_INFO, SHARDED, STEP_MODEL, ModelInfo, ServableInfo, TokenizerSource
from .resumable import load_sharded_weights, load_weights
from .seed_pt_reader import read_seed_pt
from .tokenizer_files import require_tokenizer
from .versioning import version_fields

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    weights: dict[str, torch.Tensor],
    tokenizer: PreTrainedTokenizerBase,
    info: ServableInfo,
) -> Path:
    """A Hugging Face ``save_pretrained`` folder plus ``distrinews.json`` (``info``, ``stamped``) and the model card.
    ``weights``: the full state dict every rank gathered; ``model`` supplies the config and file layout."""
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
    names = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    return next((directory / name for name in names if (directory / name).is_file()), directory)


Loaded = tuple[torch.nn.Module, Any, ModelInfo]


def _check_folder(path: Path) -> dict[str, Any]:
    """What every folder format is checked for: its ``config.json`` parses (returned) and each safetensors
    header reads (no tensor is loaded)."""
    from safetensors import safe_open

    config: dict[str, Any] = records.read_json(path / "config.json")
    for weights in sorted(path.glob("*.safetensors")):
        with loading(weights), safe_open(str(weights), framework="pt") as fh:
            fh.keys()
    return config


def _from_folder(folder: Path, labels: list[str] | None = None) -> tuple[Any, Any]:
    """The model and tokenizer of a folder's own files: a Hugging Face folder's weights, or, given a step's
    ``labels``, the architecture of its ``records.STEP_MODEL`` alone (the step's weights replace every one)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    # local_files_only: the folder's own files, never the hub (refuse_pointers has refused what points elsewhere)
    if labels is None:
        with loading(_weights_file(folder)):
            model = AutoModelForSequenceClassification.from_pretrained(str(folder), local_files_only=True)
    else:
        with loading(folder / "config.json"):
            config = AutoConfig.from_pretrained(str(folder), local_files_only=True, **label_fields(labels))
        model = AutoModelForSequenceClassification.from_config(config)
    with loading(folder):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return model, tokenizer


# One reader per format: each makes every check of its format (runs nothing, loads no tensor), then returns
# what loads the model.


def _read_model_folder(found: records.CheckpointFormat) -> Callable[[], Loaded]:
    """``best/`` (a Hugging Face folder whose ``distrinews.json`` says the rest) or any other Hugging Face
    sequence-classification folder (its labels, TrainConfig's max_length); either with its own tokenizer."""
    path = found.path
    refuse_pointers(path)  # an adapter, code to import, a tokenizer file elsewhere: before anything is read
    servable = records.read_servable_info(path) if found.servable else None  # its format version, keys and types
    _check_folder(path)
    base_model = servable.model_name if servable else None
    if base_model in (SHIPPED_MINILM, TINY_RANDOM):
        with contextlib.suppress(RuntimeError):  # its package is not installed here: the name alone
            base_model = resolve_model_path(base_model)
    require_tokenizer(path, base_model)

    def load() -> Loaded:
        model, tokenizer = _from_folder(path)
        labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
        source = TokenizerSource("checkpoint", str(path))
        info = ModelInfo.of(
            servable or ServableInfo(label_names=labels), checkpoint_format=found.kind, tokenizer=source
        )
        return model, tokenizer, info

    return load


def _read_step(found: records.CheckpointFormat) -> Callable[[], Loaded]:
    """A resumable ``step-N``: the architecture and tokenizer from its own ``STEP_MODEL`` folder (a field its training
    config lacks takes TrainConfig's default), then its weights, replicated or sharded. It reads nothing outside
    the folder: a step saved without ``STEP_MODEL`` loads only where its base model is one this package ships."""
    path = found.path
    verify_checkpoint(path)  # before any of its files is parsed: each as its save wrote it, sharded metadata safe
    config, state = _check_folder(path), records.read_trainer_state(path)
    own = path / STEP_MODEL
    if (own / "config.json").is_file():
        refuse_pointers(own)
        require_tokenizer(own)
    elif config.get("model_name_or_path", field_default("model_name_or_path")) not in (SHIPPED_MINILM, TINY_RANDOM):
        raise CheckpointError(
            f"could not load checkpoint {path}: it holds no model config of its own ({STEP_MODEL}/config.json), and "
            f"the base model its config.json names ({str(config.get('model_name_or_path'))[:80]!r}) is outside the "
            "folder, which loading never reads: serve the run's best/, or resume the run to save a step that holds it"
        )

    def setting(key: str) -> Any:
        return config[key] if key in config else field_default(key)

    def load() -> Loaded:
        from ..model import add_lora, build_model

        name, labels = setting("model_name_or_path"), list(state.label_names)
        if (own / "config.json").is_file():
            model, tokenizer = _from_folder(own, labels)
            source = TokenizerSource("checkpoint", str(own))
        else:  # a shipped base model: the package's own files
            model = build_model(name, labels=labels, dropout=setting("dropout"), seed=setting("seed"))
            tokenizer, source = build_tokenizer(name), TokenizerSource("base_model", name=name)
        if setting("use_peft"):
            model = add_lora(model, setting("lora_r"), setting("lora_alpha"), 0.0, setting("lora_target_modules"))
        weights = path / (SHARDED if found.sharded else "model.safetensors")
        with loading(weights):
            if found.sharded:
                load_sharded_weights(model, path)
            else:
                load_weights(model, weights)
        info = ModelInfo(
            label_names=labels,
            epoch=state.epoch,
            metrics=state.last_eval,
            max_length=setting("max_length"),
            model_name=name,
            training_config=config,
            checkpoint_format=found.kind,
            tokenizer=source,
        )
        return model, tokenizer, info

    return load


_READERS = {"pretrained": _read_model_folder, "resumable": _read_step, "pt": read_seed_pt}


def check_loadable(path: str | os.PathLike[str]) -> Callable[[], Loaded]:
    """A checkpoint's format recognised (``records.recognise``) and every check of it made, before a server starts
    or a model loads; returns what loads it. Raises :class:`CheckpointError` (one line naming the file) or
    ``FileNotFoundError``; runs nothing."""
    found = records.recognise(path)
    return _READERS[found.kind](found)


def load_for_inference(path: str | os.PathLike[str]) -> Loaded:
    """(model in eval mode, tokenizer, :class:`~.records.ModelInfo`) from any checkpoint ``check_loadable`` reads;
    :class:`CheckpointError` (one line) or ``FileNotFoundError`` as it raises them."""
    model, tokenizer, info = check_loadable(path)()
    return merged(model).eval(), tokenizer, info  # merged: a resumable LoRA checkpoint's adapters folded in

"""What in a checkpoint folder would make loading read outside it, refused before anything is loaded.

A checkpoint is loaded from its own files only (never the hub), and whoever writes its folder writes its manifest
too, so the manifest cannot stop a file that points elsewhere. Refused here, one line naming the file:

- a LoRA adapter: transformers would load its ``base_model_name_or_path`` (another folder or repository), then
  the adapter through peft, not from safetensors we read (DistriNews saves ``best/`` with the adapters folded in);
- ``auto_map`` in ``config.json`` or ``tokenizer_config.json``: code to import, possibly from another repository;
- a ``*_file`` entry of ``tokenizer_config.json`` that names a path, not a file of the folder.

Standard library only (and ``records``): no torch, no transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .records import read_json

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
CODE_KEY = "auto_map"
CONFIG_FILES = ("config.json", "tokenizer_config.json")


def refuse_pointers(folder: str | Path) -> None:
    """Raise :class:`CheckpointError` where a file of ``folder`` would make loading it read outside it."""
    folder = Path(folder)
    for name in ADAPTER_FILES:
        if (folder / name).is_file() or (folder / name).is_symlink():
            raise CheckpointError(
                f"could not load checkpoint {folder}: {folder / name} is a LoRA adapter, which loads its base model "
                f"from outside the folder{_base_model(folder)} and its weights outside DistriNews's own safetensors "
                "reader: refused. Fold the adapter into the model (peft's merge_and_unload, then save_pretrained); "
                "DistriNews saves best/ that way"
            )
    for name in CONFIG_FILES:
        if not (folder / name).is_file() and not (folder / name).is_symlink():
            continue
        data = read_json(folder / name)  # bounded, never through a link
        if not isinstance(data, dict):
            continue
        if CODE_KEY in data:
            raise CheckpointError(
                f"could not load checkpoint {folder}: {folder / name} names code to import ('{CODE_KEY}'), which "
                "loading never runs: refused"
            )
        if name == "tokenizer_config.json" and (outside := _outside_file(data)):
            key, value = outside
            raise CheckpointError(
                f"could not load checkpoint {folder}: {folder / name} key '{key}' names {value[:80]!r}, not a file of "
                "the folder: refused"
            )


def _base_model(folder: Path) -> str:
    try:
        data = read_json(folder / ADAPTER_FILES[0])
    except CheckpointError:
        return ""
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    return f" ({str(base)[:80]!r})" if base else ""


def _outside_file(data: dict[str, Any]) -> tuple[str, str] | None:
    for key, value in data.items():
        if key.endswith("_file") and isinstance(value, str) and (Path(value).name != value or value in ("", ".", "..")):
            return key, value
    return None

"""Reading a ``torch.distributed.checkpoint`` folder (``sharded/``) without running code from it.

torch reads such a folder with ``pickle.load`` (its ``.metadata``) and ``torch.load(weights_only=False)``, so a
planted file runs code. Here the metadata goes through an unpickler that builds only the classes torch writes into
it, and every other value through ``torch.load(weights_only=True)``; anything else is a :class:`CheckpointError`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from ..errors import CheckpointError
from .load_errors import _why, first_line, loading

METADATA = ".metadata"
# What torch's planner pickles for a model of any size is a few hundred bytes a tensor: 64 MiB is far beyond any model.
METADATA_LIMIT = 64 << 20

# Each name the metadata of a DCP checkpoint may refer to; building one runs no code of the file's choosing.
_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "StorageMeta",
        "MetadataIndex",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"the file refers to {module}.{name}, which a checkpoint's metadata never holds")


def read_metadata(path: Path) -> Metadata:
    """``path`` (a DCP ``.metadata`` file) unpickled with only the classes torch writes there; else CheckpointError."""
    with loading(path), open(path, "rb") as fh:
        data = fh.read(METADATA_LIMIT + 1)
    if len(data) > METADATA_LIMIT:
        raise CheckpointError(
            f"could not load checkpoint {path}: over {METADATA_LIMIT >> 20} MiB (refused, not loaded)"
        )
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"could not load checkpoint {path}: {first_line(exc)} (refused, not loaded)") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise CheckpointError(f"could not load checkpoint {path}: not readable metadata ({first_line(exc)})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"could not load checkpoint {path}: holds a {type(metadata).__name__}, not a checkpoint's metadata"
        )
    storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        # torch reads each shard from the folder by this name: one beside the metadata, never a path out of it
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise CheckpointError(
                f"could not load checkpoint {path}: names the shard {name!r}, not a file of its folder (refused)"
            )
    return metadata


class SafeReader(FileSystemReader):
    """torch's file-system reader, with the metadata read by :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """torch's load planner, with the values that are not tensors (optimizer hyperparameters) loaded weights-only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load_sharded(state: dict[str, Any], directory: Path, no_dist: bool = False) -> None:
    """``dcp.load(state, directory)`` through :class:`SafeReader` and :class:`SafeLoadPlanner`; a refused or
    unreadable file is one :class:`CheckpointError` on every rank (not torch's ``CheckpointException``)."""
    from torch.distributed.checkpoint import state_dict_loader as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    read_metadata(directory / METADATA)  # refused here in one line: torch would log the refusal and try other files
    try:
        dcp.load(state, storage_reader=SafeReader(directory), planner=SafeLoadPlanner(), no_dist=no_dist)
    except CheckpointException as exc:
        failures = [error for rank_error in exc.failures.values() for error in rank_error[:1]]
        refused = next((e for e in failures if isinstance(e, CheckpointError)), None)
        if refused is not None:
            raise CheckpointError(str(refused)) from None
        first = failures[0] if failures else exc
        raise CheckpointError(f"could not load checkpoint {directory}: {_why(first)}") from exc

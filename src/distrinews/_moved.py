"""Deprecated module paths, each mapped to the module that now has its code, so that imports of them keep working.

``import distrinews.trainer`` (or ``python -m`` of a deprecated path) gives the module at its
current path, ``distrinews.train.trainer``, under both names, with a ``DeprecationWarning`` naming
the path to use. Three deprecated modules share their name with a package (``checkpoint``,
``data``, ``distributed``): those packages answer the names the module offered through
``moved_attribute``, importing the module that has each name only when it is asked for, so
importing the package stays as light as its own modules (the slim server imports
``distrinews.checkpoint.tokenizer_files`` without torch). Standard library only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import CodeType, ModuleType
from typing import Any


def _under(package: str, modules: str) -> dict[str, str]:
    return {f"distrinews.{m}": f"{package}.{m}" for m in modules.split()}


MOVED_MODULES = {
    **_under("distrinews.train", "trainer evaluation precision dropout flops metrics curves preflight"),
    **_under("distrinews.distributed", "launch rollcall watchdog preemption machine parallel"),
    **_under("distrinews.checkpoint", "modelcard rundir tokenizer_files versioning"),
    **_under(
        "distrinews.export", "space space.accuracy space.bundle space.checks space.dockerfile space.push space.readme space.requirements"
    ),
    "distrinews.doctor": "distrinews.cli.doctor.checks",
    "distrinews.serve.onnx_export": "distrinews.export.onnx",
    "distrinews.serve.predictor": "distrinews.predict.runtimes",
    "distrinews.serve.tokens": "distrinews.predict.tokens",
}


def _names(module: str, names: str) -> dict[str, str]:
    return dict.fromkeys(names.split(), module)


MOVED_NAMES = {
    "distrinews.checkpoint": {
        **_names(
            "distrinews.checkpoint.manifest",
            "STEP_DIR MANIFEST list_checkpoints rotate_checkpoints write_manifest verify_checkpoint resolve_resume",
        ),
        **_names("distrinews.checkpoint.servable", "SERVABLE_INFO save_servable check_loadable load_for_inference"),
        **_names("distrinews.checkpoint.space", "space_needed saving_together"),
        **_names(
            "distrinews.checkpoint.resumable",
            "SHARDED Checkpointer LoadedCheckpoint save_weights load_weights load_sharded_weights capture_rng_state restore_rng_state",
        ),
        **_names("distrinews.export.legacy_pt", "export_legacy_pt"),
        **_names("distrinews.errors", "CheckpointError DiskFullError"),
    },
    "distrinews.data": {
        **_names("distrinews.data.rows", "DATA_ENV HUB_DATASET GET_DATA RawSplit clean_text"),
        **_names("distrinews.data.csv_files", "read_csv"),
        **_names("distrinews.data.splits", "resolve_data_dir load_split stratified_sample"),
        **_names("distrinews.data.tokenized", "CACHE_ENV TokenizedDataset default_cache_dir tokenize tokenize_cached"),
        **_names("distrinews.data.sampler", "TrainSampler eval_shard steps_per_epoch"),
        **_names("distrinews.data.collate", "Collator"),
        **_names("distrinews.errors", "DataError"),
    },
    "distrinews.distributed": {
        **_names(
            "distrinews.distributed.process_group",
            "DistEnv GpuShareError die_with_launcher check_one_gpu_per_process distributed_context barrier "
            "all_reduce_sum all_reduce_max all_gather_object broadcast_object main_process_first",
        ),
        **_names("distrinews.errors", "ConfigError"),
    },
}


def _warn(old: str, new: str) -> None:
    # stacklevel 3: the code that imported, past this function and its caller
    warnings.warn(f"{old} is deprecated; import {new} instead", DeprecationWarning, stacklevel=3)


class _AliasLoader(importlib.abc.Loader):
    """Loads a deprecated path as the module at its current path: the same module object, not a copy."""

    def __init__(self, new: str):
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        _warn(spec.name, self.new)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system gave the module the deprecated path's spec; it keeps its own.
        module.__spec__ = self.spec

    def get_code(self, fullname: str) -> CodeType:
        """``python -m`` of a deprecated path: code that runs the current module as ``__main__``."""
        _warn(fullname, self.new)
        return compile(f"import runpy\nrunpy.run_module({self.new!r}, run_name='__main__', alter_sys=True)\n", f"<{fullname}>", "exec")


class MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        # First: the standard finders would load a module under a deprecated package path
        # (distrinews.space.bundle through distrinews.space's __path__) as a second copy.
        sys.meta_path.insert(0, MovedFinder())


def moved_attribute(package: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that answers the names its deprecated module offered."""
    names = MOVED_NAMES[package]

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        _warn(f"{package}.{name}", f"{module}.{name}")
        return getattr(importlib.import_module(module), name)

    return __getattr__

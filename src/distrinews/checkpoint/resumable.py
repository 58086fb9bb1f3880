"""Resumable checkpoints, ``checkpoints/step-N/``: weights, optimizer, scheduler, scaler, every rank's RNG state,
and the average of the weights when the run keeps one (``ema_decay``).

Tensors are stored as safetensors; whatever goes through ``torch.load`` is loaded with
``weights_only=True``. Replicated (DDP) and sharded (FSDP) runs write different weight layouts;
``Checkpointer`` hides which.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from .. import tracing
from ..distributed.process_group import DistEnv, all_gather_object, barrier, broadcast_object
from ..errors import CheckpointError
from .atomic import fresh_tmp, publish_dir, removed_on_failure
from .disk_space import saving_together, space_needed
from .manifest import list_checkpoints, rotate_checkpoints, write_manifest
from .records import SHARDED, STEP_MODEL, TRAINER_STATE, TrainState, read_trainer_state


def save_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    """A state dict as safetensors; a tensor that aliases an earlier one (tied weights) is stored once."""
    first: dict[tuple[int, int, tuple[int, ...]], tuple[str, torch.Tensor]] = {}  # by storage, offset and shape
    for name, tensor in weights.items():
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
        first.setdefault(key, (name, tensor))
    save_file({name: t.detach().contiguous().cpu() for name, t in first.values()}, str(path), metadata={"format": "pt"})


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load what ``save_weights`` wrote; only aliases of stored tensors may be missing from the file."""
    state = load_file(str(path), device=str(next(model.parameters()).device))
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    stored = {own[k].untyped_storage().data_ptr() for k in state if k in own}
    missing = [k for k in missing if own[k].untyped_storage().data_ptr() not in stored]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")


def capture_rng_state() -> dict[str, Any]:
    import numpy as np  # a dependency of transformers

    numpy_state = np.random.get_state()
    assert isinstance(numpy_state, tuple), "get_state's default is the legacy form, a tuple"
    kind, keys, pos, has_gauss, cached = numpy_state
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    state["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
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


class CheckpointedModel(Protocol):
    """What a checkpoint reads and writes of the training model (``distributed.parallel.ParallelModel``, which
    checkpoint/ does not import: the server's bundle takes this module and none of distributed/)."""

    sharded: bool  # parameters split over the ranks: every rank writes its shards
    module: torch.nn.Module  # what forward and backward run through (DDP, FSDP, or the model itself)
    raw: torch.nn.Module  # the unwrapped model

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...


class Averaged(Protocol):
    """What a checkpoint keeps of an average of the weights (``train.ema.WeightAverage``): tensors by name."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


@dataclass
class LoadedCheckpoint:
    trainer_state: TrainState
    rng_states: list[dict[str, Any]]  # one per rank of the run that wrote it
    average_loaded: bool = False  # the checkpoint held the average of the weights, now in the run's

    @property
    def world_size(self) -> int | None:
        return self.trainer_state.world_size


AVERAGE_FILE = "ema.safetensors"  # the average of the weights, replicated runs
AVERAGE_SHARDED = "sharded-ema"  # and sharded ones


class ReplicatedLayout:
    """Every rank holds the whole model (DDP, one process): rank 0 writes ``model.safetensors`` and ``optimizer.pt``."""

    sharded = False

    def gather(self, model: CheckpointedModel, optimizer: torch.optim.Optimizer, env: DistEnv) -> tuple[Any, Any]:
        """The states to write (every rank calls this: gathering may be a collective)."""
        return model.full_state_dict(), optimizer.state_dict() if env.is_main else {}

    def write(
        self, states: tuple[Any, Any], tmp: Path | None, env: DistEnv, average: dict[str, torch.Tensor] | None
    ) -> None:
        if env.is_main:
            assert tmp is not None, "the main rank writes into the checkpoint's temporary folder"
            save_weights(states[0], tmp / "model.safetensors")
            torch.save(states[1], tmp / "optimizer.pt")
            if average is not None:
                save_file({k: v.detach().contiguous().cpu() for k, v in average.items()}, str(tmp / AVERAGE_FILE))

    def read(
        self, path: Path, model: CheckpointedModel, optimizer: torch.optim.Optimizer, average: Averaged | None
    ) -> bool:
        if (path / SHARDED).is_dir():  # a sharded checkpoint: this layout reads it too, resharded to the whole model
            return ShardedLayout().read(path, model, optimizer, average)
        load_weights(model.raw, path / "model.safetensors")
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu"))
        if average is None or not (path / AVERAGE_FILE).is_file():
            return False
        average.load_state_dict(load_file(str(path / AVERAGE_FILE)))
        return True


class ShardedLayout:
    """Parameters split over the ranks (FSDP): every rank writes its shards of both states with
    ``torch.distributed.checkpoint`` into ``sharded/``, which loads back at any world size."""

    sharded = True

    def gather(self, model: CheckpointedModel, optimizer: torch.optim.Optimizer, env: DistEnv) -> tuple[Any, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        return get_state_dict(model.module, optimizer)

    def write(self, states: tuple[Any, Any], tmp: Path, env: DistEnv, average: dict[str, torch.Tensor] | None) -> None:
        _dcp_save({"model": states[0], "optim": states[1]}, tmp / SHARDED)
        if average is not None:  # DTensors like the parameters they average: resharded on load as the weights are
            _dcp_save({"ema": average}, tmp / AVERAGE_SHARDED)
        barrier(env)  # every rank's shards are on disk before rank 0 seals the directory

    def read(
        self, path: Path, model: CheckpointedModel, optimizer: torch.optim.Optimizer, average: Averaged | None
    ) -> bool:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        from .sharded_reader import load_sharded

        if not (path / SHARDED).is_dir():
            raise CheckpointError(f"{path} was written by a replicated run (ddp); resume it with --strategy ddp")
        model_state, optim_state = get_state_dict(model.module, optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        load_sharded(state, path / SHARDED)  # reshards to this run's world size
        set_state_dict(model.module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if average is None or not (path / AVERAGE_SHARDED).is_dir():
            return False
        wanted = {"ema": average.state_dict()}
        load_sharded(wanted, path / AVERAGE_SHARDED)
        average.load_state_dict(wanted["ema"])
        return True


def _dcp_save(state: dict[str, Any], directory: Path) -> None:
    from torch.distributed.checkpoint import state_dict_saver as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(state, checkpoint_id=str(directory))
    except CheckpointException as exc:  # a BaseException, raised on every rank: made an error like the others
        first = next(iter(exc.failures.values()))[0] if exc.failures else None
        raise RuntimeError(f"torch.distributed.checkpoint could not save {directory}") from (first or exc)


def layout_for(model: CheckpointedModel) -> ReplicatedLayout | ShardedLayout:
    """How ``model``'s weights and optimizer state lie in a checkpoint: the one place that asks the strategy."""
    return ShardedLayout() if model.sharded else ReplicatedLayout()


class Checkpointer:
    """Writes and reads ``root/step-N``; ``save`` and ``load`` are called by every rank. The model and optimizer
    states go in the model's layout (``layout_for``). Then rank 0 adds the scheduler, scaler, every rank's RNG state,
    the trainer state, the config and ``STEP_MODEL/`` (the model's config and the tokenizer, so that the step loads
    for inference from its own files alone), then the manifest, last, and publishes the directory. ``load`` checks
    the trainer state before any tensor."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        env: DistEnv,
        save_total_limit: int | None,
        config: dict[str, Any],
        tokenizer: Any = None,
    ):
        self.root, self.env, self.limit, self.config = Path(root), env, save_total_limit, config
        self.tokenizer = tokenizer  # None: no ``STEP_MODEL`` folder

    @tracing.traced(
        "distrinews.checkpoint.save",
        lambda self, step, *args, **kwargs: {
            "distrinews.step": step,
            "distrinews.rank": self.env.rank,
            "distrinews.world_size": self.env.world_size,
        },
        lambda path: {"distrinews.checkpoint.path": str(path)} if path is not None else {},
    )
    def save(
        self,
        step: int,
        model: CheckpointedModel,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler | None,
        trainer_state: TrainState,
        average: Averaged | None = None,
    ) -> Path | None:
        if not isinstance(trainer_state, TrainState):
            raise TypeError(
                "Checkpointer.save takes a TrainState "
                f"(distrinews.checkpoint.records), not {type(trainer_state).__name__}"
            )
        rng_states = all_gather_object(capture_rng_state(), self.env)
        final = self.root / f"step-{step}"
        main = self.env.is_main
        layout = layout_for(model)
        states = layout.gather(model, optimizer, self.env)
        average_state = average.state_dict() if average is not None else None

        def needed() -> tuple[int, str]:
            published = list_checkpoints(self.root)
            return space_needed(published[-1] if published else None, (states, average_state))

        # Two steps, so that no rank waits for the temp directory's name while rank 0 reports a failure to make it.
        with saving_together(self.env, final, self.root, needed):
            tmp = fresh_tmp(final) if main else None
        tmp = broadcast_object(tmp, self.env)
        with saving_together(self.env, final, self.root, needed), removed_on_failure(tmp if main else None):
            layout.write(states, tmp, self.env, average_state)
            if main:
                torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
                if scaler is not None:
                    torch.save(scaler.state_dict(), tmp / "scaler.pt")
                torch.save(rng_states, tmp / "rng_state.pt")
                state = trainer_state.model_copy(
                    update={"global_step": step, "world_size": self.env.world_size, "sharded": layout.sharded}
                )
                (tmp / TRAINER_STATE).write_text(json.dumps(state.to_json(), indent=2))
                (tmp / "config.json").write_text(json.dumps(self.config, indent=2))
                if self.tokenizer is not None:  # what servable._read_step builds the model and tokenizes with
                    from ..model import hf_config, transformers_model

                    hf_config(transformers_model(model.raw)).save_pretrained(str(tmp / STEP_MODEL))
                    self.tokenizer.save_pretrained(str(tmp / STEP_MODEL))
                write_manifest(tmp, step)  # last: a checkpoint without one never finished
                publish_dir(tmp, final)
        if not main:
            return None
        rotate_checkpoints(self.root, self.limit)
        return final

    def load(
        self,
        path: str | os.PathLike[str],
        model: CheckpointedModel,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler | None,
        average: Averaged | None = None,
    ) -> LoadedCheckpoint:
        """Everything back in place; ``average`` too when the checkpoint holds one (``average_loaded``)."""
        path = Path(path)
        trainer_state = read_trainer_state(path)  # a newer format or a missing key: refused before any tensor loads
        average_loaded = layout_for(model).read(path, model, optimizer, average)
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        if scaler is not None and (path / "scaler.pt").is_file():
            scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
        rng = torch.load(path / "rng_state.pt", weights_only=True)
        return LoadedCheckpoint(trainer_state, rng, average_loaded)


def load_sharded_weights(model: torch.nn.Module, directory: Path) -> None:
    """The model weights of a sharded checkpoint, consolidated in this one process (no process group)."""
    from .sharded_reader import load_sharded

    state = {"model": model.state_dict()}
    # no_dist: this process alone, even inside a process group (e.g. rank 0 of an evaluation).
    load_sharded(state, directory / SHARDED, no_dist=True)
    model.load_state_dict(state["model"])

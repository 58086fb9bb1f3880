"""How the model is spread over the processes: one entry point, ``wrap_model``, per ``strategy``.

- ``ddp`` (default): every rank holds the whole model; DistributedDataParallel averages gradients in buckets while
  backward runs. With one process it is the plain module: world size 1 and N share one code path.
- ``fsdp``: parameters, gradients and optimizer state sharded over the ranks with FSDP2 (``fully_shard``), one unit
  per transformer block plus the root: a block's parameters are gathered just before it runs and freed after.
- ``single``: one process only; refuses to start under N (for runs that must not be split).

What differs between strategies lives here and nowhere else: skipping the gradient sync within an accumulation
window, clipping, the communication a step costs, and gathering a full state dict for saving (a collective every
rank enters, though only rank 0 writes). How each lies on disk is ``checkpoint/resumable.py``'s ``layout_for``.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..config import ConfigError, ParallelConfig
from ..model import forward_loss
from .comm_hooks import compressed_allreduce_hook, shm_allreduce_hook
from .process_group import DistEnv, all_gather_object
from .shm_allreduce import SHM_DIR, open_segment, why_not_shared_memory

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule


def trainable_bytes(model: torch.nn.Module) -> int:
    """The bytes of the gradients a backward makes: every trainable parameter's, what DDP all-reduces."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class ParallelModel:
    """The wrapped model (call it like the module) plus the strategy's own operations."""

    sharded = False  # parameters split over the ranks (checkpoints are then written by every rank)
    # Every rank's forward needs every other rank (parameters are all-gathered per block), so an
    # evaluation's ranks must run the same number of forwards, padding with dummy batches.
    lockstep = False

    def __init__(self, module: torch.nn.Module, raw: torch.nn.Module, strategy: str, env: DistEnv, allreduce: str = ""):
        self.allreduce = allreduce  # how DDP averages the gradients (the banner's words), "" without DDP
        self.module = module  # what forward and backward run through (DDP, or the model itself)
        self.raw = raw  # the unwrapped model: its config, save_pretrained and (unless sharded) its tensors
        self.strategy, self.env = strategy, env

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> ParallelModel:
        self.module.train(mode)
        return self

    @property
    def replicated(self) -> bool:
        """True when every rank holds the whole model and gradients are all-reduced (DDP, N processes)."""
        return isinstance(self.module, DDP)

    @property
    def title(self) -> str:
        """The banner's name for how the model is spread: DDP, FSDP, or nothing with one process."""
        return "DDP" if self.replicated else ""

    def trainable_bytes(self) -> int:
        return trainable_bytes(self.raw)

    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[Any]:
        """Enter around forward + backward; ``sync=False`` keeps the gradients local (accumulation)."""
        if sync or not self.replicated:
            return contextlib.nullcontext()
        return cast(DDP, self.module).no_sync()  # replicated: DDP

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor | None:
        """Clip the (already averaged) gradients to ``max_norm``; returns the norm before clipping."""
        if max_norm <= 0:
            return None
        return torch.nn.utils.clip_grad_norm_([p for p in self.raw.parameters() if p.grad is not None], max_norm)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 (empty elsewhere when sharded). Every rank must call it."""
        return {k: v.detach() for k, v in self.raw.state_dict().items()}

    def replica_digests(self) -> list[str]:
        """Every rank's SHA-256 of its parameters (a collective): replicas must all show the same one.
        Empty where there are no replicas to compare (one process, or sharded parameters)."""
        if not self.replicated:
            return []
        digest = hashlib.sha256()
        for tensor in self.raw.state_dict().values():
            digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return all_gather_object(digest.hexdigest()[:16], self.env)

    def gradient_bytes(self) -> int:
        """Bytes one rank sends into the gradient all-reduce each optimizer step (0 with one process)."""
        return self.trainable_bytes() if self.replicated else 0

    def communication(self) -> str:
        """What one optimizer step sends between the ranks, for the banner."""
        if not self.replicated:
            return "none (one process)"
        return f"all-reduce of {_size(self.gradient_bytes())} of gradients ({self.allreduce})"


class ShardedModel(ParallelModel):
    """FSDP2: ``module`` and ``raw`` are the same model, whose parameters are DTensor shards."""

    sharded = True
    lockstep = True
    title = "FSDP"

    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager[Any]:
        # FSDP2's no_sync: keep unsharded gradients until the window's last micro-batch reduce-scatters them.
        cast("FSDPModule", self.module).set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast("dict[str, torch.Tensor]", state)  # a full state dict of a model holds tensors only

    def gradient_bytes(self) -> int:
        return self.trainable_bytes()

    def communication(self) -> str:
        # every parameter is sharded and gathered for the forward; only trained ones have gradients to reduce-scatter
        gathered = sum(p.numel() * p.element_size() for p in self.raw.parameters())
        return (
            f"all-gather of {_size(gathered)} of parameters (forward, and again in backward where gradients flow) and "
            f"reduce-scatter of {_size(self.trainable_bytes())} of gradients; each rank keeps 1/{self.env.world_size}"
        )


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def wrap_model(
    model: torch.nn.Module,
    config: ParallelConfig,
    env: DistEnv,
    param_dtype: torch.dtype | None = None,
    run: str | os.PathLike[str] | None = None,
) -> ParallelModel:
    """Wrap ``model`` (already on ``env.device``) for ``config.strategy``. ``param_dtype``: the compute dtype FSDP
    casts its gathered parameters to (gradients are reduced in fp32); ``run``: the run's output directory, which
    names its shared-memory segment."""
    strategy = config.strategy
    if strategy not in ("single", "ddp", "fsdp"):
        raise ConfigError(f"config field 'strategy': unknown strategy {strategy!r}")
    if strategy == "single" and env.distributed:
        raise ConfigError(f"config field 'strategy': 'single' cannot run with {env.world_size} processes; use ddp")
    if not env.distributed:  # one process holds everything: nothing to replicate or shard
        return ParallelModel(model, model, strategy, env)
    if strategy == "fsdp":
        return ShardedModel(_fsdp(model, param_dtype), model, "fsdp", env)
    ddp, how = _ddp(model, config, env, run)
    return ParallelModel(ddp, model, "ddp", env, allreduce=how)


# ---------------------------------------------------------------------- FSDP2
def _fsdp(model: torch.nn.Module, param_dtype: torch.dtype | None) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    # One unit per block the model says must not be split (Hugging Face's _no_split_modules, as
    # accelerate's auto-wrap uses): its parameters are gathered together, just before it runs.
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in block_names and module is not model:
            fully_shard(module, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


# ---------------------------------------------------------------------- DDP
def ddp_bucket_cap_mb(config: ParallelConfig, device: torch.device) -> float:
    if config.ddp_bucket_cap_mb is not None:
        return config.ddp_bucket_cap_mb
    # One bucket for MiniLM's 87 MiB of gradients on CPU, where gloo reduces on the core that
    # computes backward (measured fastest, benchmarks/README.md); torch's 25 MB on GPU, where
    # overlapping the all-reduce with backward pays.
    return 25.0 if device.type == "cuda" else 100.0


def _ddp(
    model: torch.nn.Module, config: ParallelConfig, env: DistEnv, run: str | os.PathLike[str] | None
) -> tuple[DDP, str]:
    not_here = why_not_shared_memory(env.backend, env.device.type, env.world_size, env.local_world_size)
    if config.ddp_comm_hook == "shm" and not_here:
        raise ConfigError(f"config field 'ddp_comm_hook': shm cannot run here: {not_here}; use auto or none")
    ddp = DDP(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=ddp_bucket_cap_mb(config, env.device),
        gradient_as_bucket_view=True,
        **_no_buffer_sync(),
    )
    how = _register_comm_hook(ddp, model, config.ddp_comm_hook, env, shared_memory=not_here is None, run=run)
    _settle_bucket_layout(ddp, model, env.device)
    return ddp, how


def _register_comm_hook(
    ddp: DDP, model: torch.nn.Module, hook: str, env: DistEnv, shared_memory: bool, run: str | os.PathLike[str] | None
) -> str:
    """Install the bucket averaging ``hook`` (``ddp_comm_hook``) asks for; returns how, for the banner.
    ``shared_memory``: this world can average through /dev/shm (``shm`` was refused before DDP if not)."""
    if hook in ("bf16", "fp16"):  # half the bytes on the wire; the optimizer still sees fp32 gradients
        ddp.register_comm_hook(None, compressed_allreduce_hook(torch.bfloat16 if hook == "bf16" else torch.float16))
        return f"{env.backend}, {hook}-compressed"
    if hook == "none" or not shared_memory:
        return f"{env.backend}"
    # a slot holds the largest bucket, at most every trainable parameter's gradient
    slot = trainable_bytes(model)
    segment = open_segment(slot, env.rank, env.world_size, run=run)
    if isinstance(segment, str):  # the same reason on every rank
        if hook == "shm":
            raise ConfigError(f"config field 'ddp_comm_hook': shm cannot run here: {segment}; use auto or none")
        return f"{env.backend}; no shared memory: {segment}"
    ddp.register_comm_hook(segment, shm_allreduce_hook)
    return f"shared memory, {_size(segment.segment_bytes)} in {SHM_DIR}"


def _settle_bucket_layout(ddp: DDP, model: torch.nn.Module, device: torch.device) -> None:
    """One synchronised backward of zeros, so that every real step reduces in one bucket layout.

    DDP reduces its first synchronised backward in registration order and every later one in a layout rebuilt from
    the order gradients became ready; the layout decides the order gloo's ring adds the ranks' values, and with three
    or more ranks (a + b) + c != (b + c) + a. Without this a run resumed after step k would reduce step k + 1 in the
    first layout and end some ulps from the uninterrupted run. Costs a 1x2-token forward and backward and one
    all-reduce of the gradients, once per run; eval mode, so no dropout draws from the RNG."""
    was_training = model.training
    model.eval()
    try:
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        loss, _ = forward_loss(ddp, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0]})
        (loss * 0).backward()
    finally:
        model.train(was_training)
    for p in model.parameters():
        p.grad = None


def _no_buffer_sync() -> dict[str, Any]:
    """BERT's buffers (position ids) are constants: syncing them costs a collective per forward."""
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:  # torch >= 2.13 spelling
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}

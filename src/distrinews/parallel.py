"""How the model is spread over the processes: one entry point, ``wrap_model``, per ``strategy``.

- ``ddp`` (default): every rank holds the whole model; gradients are averaged by
  DistributedDataParallel in buckets while backward runs. With one process it is the plain
  module, so world size 1 and N share one code path.
- ``single``: one process only; refuses to start under N processes (a guard for runs that must
  not be split, e.g. a reference measurement).

What differs between strategies lives here and nowhere else: skipping the gradient sync on
the micro-steps of an accumulation window, gradient clipping, and gathering a full state
dict for saving (a collective every rank must enter, even though only rank 0 writes).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import ConfigError, TrainConfig
from .distributed import DistEnv, all_gather_object


class ParallelModel:
    """The wrapped model (call it like the module) plus the strategy's own operations."""

    def __init__(self, module: torch.nn.Module, raw: torch.nn.Module, strategy: str, env: DistEnv):
        self.module = module  # what forward and backward run through (DDP, or the model itself)
        self.raw = raw  # the unwrapped model: its parameters, config and save_pretrained
        self.strategy = strategy
        self.env = env

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> ParallelModel:
        self.module.train(mode)
        return self

    @property
    def replicated(self) -> bool:
        """True when gradients are all-reduced across ranks (DDP with more than one process)."""
        return isinstance(self.module, DDP)

    def sync_gradients(self, sync: bool) -> contextlib.AbstractContextManager:
        """Enter around forward + backward; ``sync=False`` keeps the gradients local (accumulation)."""
        if sync or not self.replicated:
            return contextlib.nullcontext()
        return self.module.no_sync()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor | None:
        """Clip the (already averaged) gradients to ``max_norm``; returns the norm before clipping."""
        if max_norm <= 0:
            return None
        return torch.nn.utils.clip_grad_norm_(self.raw.parameters(), max_norm)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights. Every rank calls it (under sharded strategies it is a collective)."""
        return {k: v.detach() for k, v in self.raw.state_dict().items()}

    def replica_digests(self) -> list[str]:
        """Every rank's SHA-256 of its parameters (a collective): replicas must all show the same one."""
        import hashlib

        digest = hashlib.sha256()
        for tensor in self.raw.state_dict().values():
            digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return all_gather_object(digest.hexdigest()[:16], self.env)

    def gradient_bytes(self) -> int:
        """Bytes of gradients one rank sends into the all-reduce each optimizer step (0 with one process)."""
        if not self.replicated:
            return 0
        return sum(p.numel() * p.element_size() for p in self.raw.parameters() if p.requires_grad)


def wrap_model(model: torch.nn.Module, config: TrainConfig, env: DistEnv) -> ParallelModel:
    """Wrap ``model`` (already on ``env.device``) for ``config.strategy``."""
    if config.strategy == "single":
        if env.distributed:
            raise ConfigError(f"config field 'strategy': 'single' cannot run with {env.world_size} processes; use ddp")
        return ParallelModel(model, model, "single", env)
    if config.strategy == "ddp":
        if not env.distributed:
            return ParallelModel(model, model, "ddp", env)
        return ParallelModel(_ddp(model, config, env), model, "ddp", env)
    raise ConfigError(f"config field 'strategy': unknown strategy {config.strategy!r}")


# ---------------------------------------------------------------------- DDP
def ddp_bucket_cap_mb(config: TrainConfig, device: torch.device) -> float:
    if config.ddp_bucket_cap_mb is not None:
        return config.ddp_bucket_cap_mb
    # One bucket for MiniLM's 87 MiB of gradients on CPU, where gloo reduces on the core that
    # computes backward (measured fastest, benchmarks/README.md); torch's 25 MB on GPU, where
    # overlapping the all-reduce with backward pays.
    return 25.0 if device.type == "cuda" else 100.0


def _ddp(model: torch.nn.Module, config: TrainConfig, env: DistEnv) -> DDP:
    ddp = DDP(
        model,
        device_ids=[env.device.index] if env.device.type == "cuda" else None,
        bucket_cap_mb=ddp_bucket_cap_mb(config, env.device),
        gradient_as_bucket_view=True,
        **_no_buffer_sync(),
    )
    if config.ddp_comm_hook != "none":  # half the bytes on the wire; the optimizer still sees fp32 gradients
        dtype = torch.bfloat16 if config.ddp_comm_hook == "bf16" else torch.float16
        ddp.register_comm_hook(None, compressed_allreduce_hook(dtype))
    return ddp


def compressed_allreduce_hook(dtype: torch.dtype):
    """A DDP comm hook: average each gradient bucket in ``dtype``. torch's own bf16 hook refuses
    anything but NCCL; gloo reduces bf16 and fp16 fine."""

    def hook(state, bucket):
        compressed = bucket.buffer().to(dtype).div_(dist.get_world_size())
        future = dist.all_reduce(compressed, async_op=True).get_future()

        def decompress(fut):
            out = bucket.buffer()
            out.copy_(fut.value()[0])
            return out

        return future.then(decompress)

    return hook


def _no_buffer_sync() -> dict[str, bool]:
    """BERT's buffers (position ids) are constants: syncing them costs a collective per forward."""
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:  # torch >= 2.13 spelling
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}

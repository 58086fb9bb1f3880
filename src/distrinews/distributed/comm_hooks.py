"""The hooks DDP averages gradient buckets with (``ddp_comm_hook``): through a /dev/shm segment, or through the
process group in a smaller dtype.

No ``from __future__ import annotations`` here, on purpose: DDP's ``register_comm_hook`` compares a hook's
``bucket`` and return annotations with ``dist.GradBucket`` and ``torch.futures.Future[torch.Tensor]`` and refuses
anything else, strings included, so these annotations must stay the objects themselves.
"""

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket

from .shm_allreduce import SharedMemoryAllReduce


def shm_allreduce_hook(state: SharedMemoryAllReduce, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's comm hook (state: the segment): the bucket's mean, done by the time it returns."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(state.allreduce_mean_(bucket.buffer()))
    return future


def compressed_allreduce_hook(dtype: torch.dtype) -> Callable[[None, GradBucket], torch.futures.Future[torch.Tensor]]:
    """A DDP comm hook (its state None): average each gradient bucket in ``dtype``. torch's own bf16 hook
    refuses anything but NCCL; gloo reduces bf16 and fp16 fine."""

    def hook(state: None, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        compressed = bucket.buffer().to(dtype).div_(dist.get_world_size())
        future = dist.all_reduce(compressed, async_op=True).get_future()

        def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            out = bucket.buffer()
            out.copy_(fut.value()[0])
            return out

        averaged: torch.futures.Future[torch.Tensor] = future.then(decompress)
        return averaged

    return hook

"""DDP takes our gradient-averaging hooks (distributed/comm_hooks.py) and they average.

DDP's ``register_comm_hook`` refuses a hook whose ``bucket`` or return annotation is anything but
``dist.GradBucket`` and ``Future[Tensor]``, strings included: these tests register each hook on a real
one-rank DDP (gloo over a file store, in this process), so a change to how that module's annotations
are written fails here rather than in a two-process run.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews.distributed.comm_hooks import compressed_allreduce_hook, shm_allreduce_hook
from distrinews.distributed.shm_allreduce import open_segment


@pytest.fixture
def one_rank(tmp_path: Path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _ddp() -> tuple[DDP, torch.nn.Linear]:
    model = torch.nn.Linear(4, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
    return DDP(model), model


@pytest.mark.usefixtures("one_rank")
def test_ddp_takes_the_compressed_hook_and_it_averages():
    ddp, model = _ddp()
    ddp.register_comm_hook(None, compressed_allreduce_hook(torch.bfloat16))
    ddp(torch.ones(1, 4)).sum().backward()
    assert model.weight.grad is not None and torch.equal(model.weight.grad, torch.ones(1, 4))


@pytest.mark.usefixtures("one_rank")
def test_ddp_takes_the_shared_memory_hook(tmp_path: Path):
    """Registered only: its average needs two ranks (tests/integration/test_shm_allreduce.py)."""
    segment = open_segment(4 * 4, 0, 1, shm_dir=str(tmp_path))
    assert not isinstance(segment, str), segment
    ddp, _ = _ddp()
    ddp.register_comm_hook(segment, shm_allreduce_hook)

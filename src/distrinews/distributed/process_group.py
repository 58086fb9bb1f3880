"""Process-group setup and teardown from torchrun's environment, and the few collectives we use. World size 1 makes
no process group: every helper is then the identity, so the trainer has one code path for 1 and N processes.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from ..config import ConfigError, field_default
from ..errors import USER_ERRORS, one_line
from .lifetime import ask_to_die_with_parent
from .machine import threads_per_process


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None when world_size == 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    if not (raw := os.environ.get(name)):
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise RuntimeError(f"environment variable {name}={raw!r} is not an integer") from exc


def die_with_launcher() -> None:
    """Under torchrun, ask Linux to kill this worker if its launcher dies: torchrun starts each worker in a session
    of its own, so a launcher killed with SIGKILL would leave it training on, writing into the run directory while a
    resumed run starts."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not ask_to_die_with_parent():
        return
    if os.getppid() == 1:  # the launcher died before we asked
        os._exit(1)


class GpuShareError(ConfigError):
    """More processes on a node than GPUs."""


def check_one_gpu_per_process(local_world_size: int) -> None:
    """Refuse to put two ranks on one GPU: they would share its memory and compute, and nccl forbids it."""
    gpus = torch.cuda.device_count()
    if local_world_size > gpus:
        raise GpuShareError(
            f"{local_world_size} processes on this node but {gpus} GPU(s) visible: one process per GPU. "
            f"Use --nproc-per-node {gpus} (or set CUDA_VISIBLE_DEVICES to more GPUs)"
        )


@contextlib.contextmanager
def distributed_context(timeout_s: float | None = None, threads: int | None = None) -> Iterator[DistEnv]:
    """Join the process group torchrun describes (if any), nccl with CUDA, else gloo; always tear it down.
    ``timeout_s``: how long a collective may wait (None: the ``ddp_timeout`` default). On CPU each process gets its
    share of the cores unless ``threads`` says otherwise (torchrun's one thread each wastes cores)."""
    die_with_launcher()
    if timeout_s is None:
        timeout_s = float(field_default("ddp_timeout"))
    world_size, rank, local_rank = _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    if torch.cuda.is_available():
        check_one_gpu_per_process(local_world_size)
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", torch.cuda.current_device()), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(threads or threads_per_process(local_world_size))

    if world_size > 1:
        dist.init_process_group(
            backend=backend,
            store=_attempt_store(datetime.timedelta(seconds=timeout_s)),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    env = DistEnv(rank, local_rank, world_size, local_world_size, device, backend if world_size > 1 else None)
    finished = False
    try:
        yield env
        finished = True
    except USER_ERRORS as exc:
        # Handed to our launcher now, before this rank's connections close: a peer blocked in a collective may abort
        # as they do, and the launcher names the earliest failure as the cause (the usage error, exit 2).
        from .launch import record_worker_error

        if world_size > 1:
            record_worker_error(one_line(exc))
        raise
    finally:
        if dist.is_available() and dist.is_initialized():
            if finished:  # every rank leaves together: none closes its connections while a peer still uses its own
                _leave_together(env)
            dist.destroy_process_group()


def _leave_together(env: DistEnv, timeout_s: float = 60.0) -> None:
    """A last barrier of a run that ended well (bounded: a peer that died at its very end does not hold this one)."""
    with contextlib.suppress(RuntimeError):  # a peer is gone: leave anyway; the launcher reports the peer
        if env.backend == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
        else:
            barrier(env)


def _attempt_store(timeout: datetime.timedelta) -> Store | None:
    """Under torchrun, the agent's store with a prefix of its own for this attempt of the worker group (None
    elsewhere). The agent keeps one store for the whole job: a restarted group's rank 0 that reached gloo's connect
    before the new rank 1 wrote its address would read the dead rank 1's and fail with "Connection refused"."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    client = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return PrefixStore(f"distrinews/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", client)


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier(device_ids=[env.device.index] if env.backend == "nccl" else None)


def all_reduce_sum(tensor: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The sum over ranks, in place (and returned). Every rank must call it."""
    if env.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The maximum over ranks, in place (and returned). Every rank must call it."""
    if env.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def all_gather_object(obj: Any, env: DistEnv) -> list[Any]:
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, env: DistEnv, src: int = 0) -> Any:
    """``src``'s ``obj`` on every rank (a collective: every rank must call it)."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


@contextlib.contextmanager
def main_process_first(env: DistEnv, local: bool = True) -> Iterator[None]:
    """The (local) main process runs the block first; the others wait, then run it (e.g. read a cache)."""
    first = env.is_local_main if local else env.is_main
    if not first:
        barrier(env)
    try:
        yield
    finally:
        if first:
            barrier(env)

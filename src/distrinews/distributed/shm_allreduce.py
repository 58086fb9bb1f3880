"""Gradient averaging through shared memory when every rank runs on this host (a DDP comm hook).

Gloo all-reduces over TCP, also on one machine: on the 2-core Xeon of benchmarks section 17, 42 MiB take ~35 ms of
copies through the loopback socket, on the cores that compute. Ranks on one host can instead share a segment of
``/dev/shm``, as DeepSpeed, vLLM and gloo's newer releases do (pytorch/gloo#458, not in torch's wheels):

1. every rank writes its bucket, divided by the world size, into its own slot;
2. barrier; rank r adds chunk r of every slot, in rank order, into chunk r of its slot;
3. barrier; every rank copies chunk k of slot k, for every k, into its bucket;
4. barrier (so no rank writes its slot for the next bucket while another still reads it).

The barriers are the process group's (gloo), so a rank that dies or stops fails the others as gloo's all-reduce
would, after ``ddp_timeout``. The result is DDP's default hook's (each contribution divided by the world size, then
summed): with two ranks bit for bit gloo's, with more in a fixed rank order, independent of the bucket layout.

Rank 0 makes the segment with ``posix_fallocate`` (a full ``/dev/shm`` fails here, not with a SIGBUS later); every
rank maps it and checks a random token rank 0 wrote (ranks seeing different ``/dev/shm``s fall back); it is unlinked
once all have mapped it, or making it failed. A kill in between leaves the name, which is the run's output
directory's (:func:`segment_prefix`): the next run there removes it, and no other run's.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import secrets
import tempfile
from typing import Any, cast

import torch
import torch.distributed as dist

SHM_DIR = "/dev/shm"
_HEADER = 64  # bytes: the token rank 0 writes, then padding to a cache line
_ALIGN = 64


def why_not_shared_memory(backend: str | None, device_type: str, world_size: int, local_world_size: int) -> str | None:
    """Why gradients cannot be averaged through /dev/shm here (None: they can be tried): it takes gloo on
    CPU, and every rank on this host (torchrun's LOCAL_WORLD_SIZE is the whole world)."""
    if backend != "gloo" or device_type != "cpu":
        return f"the {backend} backend on {device_type} reduces on its own"
    if world_size < 2 or local_world_size != world_size:
        return f"{world_size} ranks, {local_world_size} on this host"
    return None


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def chunk_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous chunks covering ``range(numel)``, sizes differing by at most one."""
    return [(k * numel // parts, (k + 1) * numel // parts) for k in range(parts)]


class SharedMemoryAllReduce:
    """One mapped segment, the state of ``comm_hooks.shm_allreduce_hook``; make it with :func:`open_segment`."""

    def __init__(self, storage: torch.UntypedStorage, slot_bytes: int, rank: int, world_size: int):
        self.storage, self.slot_bytes, self.rank, self.world_size = storage, slot_bytes, rank, world_size
        self.segment_bytes = segment_bytes(slot_bytes, world_size)

    def _slots(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A (world_size, numel) view of the slots, in ``dtype``."""
        raw = torch.empty(0, dtype=torch.uint8).set_(self.storage, 0, (self.segment_bytes,), (1,))
        per_slot = self.slot_bytes // dtype.itemsize
        return raw[_HEADER:].view(dtype).view(self.world_size, per_slot)[:, :numel]

    def allreduce_mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average ``tensor`` (flat, contiguous) over the ranks in place; every rank must call it."""
        n, r = self.world_size, self.rank
        if (size := tensor.numel() * tensor.element_size()) > self.slot_bytes:
            raise ValueError(f"a bucket of {size} bytes is larger than the slot ({self.slot_bytes})")
        slots = self._slots(tensor.dtype, tensor.numel())
        torch.div(tensor, n, out=slots[r])
        dist.barrier()
        chunks = chunk_bounds(tensor.numel(), n)
        a, b = chunks[r]
        if b > a:
            parts = [slots[k, a:b] for k in range(n)]
            # (s0 + s1) + s2 + ...: rank order, whichever rank does the adding
            total = torch.add(parts[0], parts[1], out=parts[r]) if r < 2 else parts[0] + parts[1]
            for part in parts[2:]:
                total.add_(part)
            if r >= 2:
                parts[r].copy_(total)
        dist.barrier()
        for k, (a, b) in enumerate(chunks):
            tensor[a:b].copy_(slots[k, a:b])
        dist.barrier()
        return tensor


def segment_bytes(slot_bytes: int, world_size: int) -> int:
    """The size of the segment :func:`open_segment` makes for buckets of up to ``slot_bytes``."""
    return _HEADER + world_size * _aligned(slot_bytes)


def segment_prefix(run: str | os.PathLike[str] | None) -> str:
    """The name every segment of ``run`` (its output directory; None: a run without one) starts with."""
    if run is None:
        return "distrinews-allreduce-"
    return f"distrinews-allreduce-{hashlib.sha256(os.path.realpath(run).encode()).hexdigest()[:16]}-"


def open_segment(
    slot_bytes: int, rank: int, world_size: int, shm_dir: str = SHM_DIR, run: str | os.PathLike[str] | None = None
) -> SharedMemoryAllReduce | str:
    """Make, map and check one segment on every rank (a collective): the hook's state, or why not (the same reason on
    every rank, so all fall back together). Rank 0 first removes what a killed process of ``run`` (its output
    directory) left in ``shm_dir``, and unlinks the segment whatever fails after making it."""
    size = segment_bytes(slot_bytes, world_size)
    slot_bytes = _aligned(slot_bytes)
    token = secrets.token_bytes(16)
    prefix = segment_prefix(run)
    path, reason = None, None
    try:
        if rank == 0:
            if run is not None:  # what a killed earlier process of this run left (only its segments carry its prefix)
                for leftover in glob.glob(os.path.join(glob.escape(shm_dir), glob.escape(prefix) + "*")):
                    with contextlib.suppress(OSError):  # another user's, or gone already
                        os.unlink(leftover)
            try:
                fd, path = tempfile.mkstemp(prefix=prefix, dir=shm_dir)
                try:
                    os.posix_fallocate(fd, 0, size)
                    os.pwrite(fd, token, 0)
                finally:
                    os.close(fd)
            except OSError as exc:
                if path is not None:
                    os.unlink(path)
                path, reason = None, f"{shm_dir}: {exc.strerror or exc}"
        shared: list[Any] = [path, token, reason]  # rank 0's, to every rank
        dist.broadcast_object_list(shared, src=0)
        path, token, reason = shared
        storage: torch.UntypedStorage | None = None
        ok = 0
        if path is not None:
            try:
                if os.path.getsize(path) == size:
                    # torch's stub types from_file as any storage; UntypedStorage's gives an UntypedStorage
                    storage = cast(torch.UntypedStorage, torch.UntypedStorage.from_file(path, shared=True, nbytes=size))
                    head = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (len(token),), (1,))
                    ok = int(bytes(head.numpy()) == token)
            except OSError:
                ok = 0
        flags = torch.tensor([ok], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)  # every rank has mapped it (or one could not) ...
    finally:
        if rank == 0 and path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # ... so the name can go: the mappings keep the memory until each rank exits
    if reason is not None:
        return str(reason)
    if not flags.item():
        return f"{path} is not the same file on every rank"
    assert storage is not None, "every rank mapped the file"
    return SharedMemoryAllReduce(storage, slot_bytes, rank, world_size)

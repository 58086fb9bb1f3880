"""The shared-memory gradient average (distributed/shm_allreduce.py) between real processes.

Each test starts its ranks with torch.multiprocessing (gloo over a file store): the answers are
compared with gloo's own all-reduce and with the sum in rank order, the segment must be gone from
/dev/shm once mapped, a failure to make it must reach every rank alike, and a rank that dies
must fail the others instead of hanging them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distrinews.distributed.shm_allreduce import (
    SHM_DIR,
    chunk_bounds,
    open_segment,
    segment_prefix,
    why_not_shared_memory,
)

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM_DIR), reason=f"{SHM_DIR} is where the segment lives")


def _spawn(fn, args: tuple, nprocs: int, timeout: float = 240.0) -> None:
    """``mp.spawn`` with a deadline: ranks that hang fail the test and are killed, never left running into the next."""
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):  # raises for a rank that failed
            assert time.monotonic() < deadline, f"ranks of {fn.__name__} still running after {timeout:g} s"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(10)


def _init(rank: int, world: int, store: str, timeout_s: float = 60) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )


def _inputs(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 + rank)).mul(10.0 ** (rank - 1)).to(dtype)


def _compare_with_gloo(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    seg = open_segment(4 * 10_007, rank, world, run=out)  # named after ``out``: this test's segment, no other's
    assert not isinstance(seg, str), seg
    results = {}
    for dtype, numel in ((torch.float32, 10_007), (torch.float32, 1), (torch.bfloat16, 333), (torch.float32, 0)):
        mine = _inputs(rank, numel, dtype)
        shm = seg.allreduce_mean_(mine.clone())
        ring = mine.clone().div_(world)  # DDP's default hook: divide, then gloo sums
        dist.all_reduce(ring)
        in_order = _inputs(0, numel, dtype).div(world)
        for k in range(1, world):
            in_order = in_order + _inputs(k, numel, dtype).div(world)
        results[f"{dtype}-{numel}"] = (shm, ring, in_order)
    for _ in range(50):  # back-to-back calls (no rank may overwrite its slot while another still reads)
        x = torch.full((4099,), float(rank + 1))
        seg.allreduce_mean_(x)
        assert torch.equal(x, torch.full((4099,), sum(range(1, world + 1)) / world)), x[:4]
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_same_answer_as_gloo_on_every_rank(tmp_path: Path, world: int):
    _spawn(_compare_with_gloo, (world, str(tmp_path / "store"), str(tmp_path / "out")), world)
    answers = [torch.load(tmp_path / f"out.{r}") for r in range(world)]
    for key, (shm, ring, in_order) in answers[0].items():
        for r in range(world):
            assert torch.equal(answers[r][key][0], shm), f"rank {r} got another answer for {key}"
        assert torch.equal(shm, in_order), key  # the sum in rank order, whichever rank added which chunk
        if world == 2:
            assert torch.equal(shm, ring), key  # a + b == b + a: bit for bit gloo's answer
        else:
            # gloo's ring adds in another order: rounding apart (bf16 keeps 8 bits of values up to ~30)
            torch.testing.assert_close(shm, ring, **({"atol": 0.25, "rtol": 0} if shm.dtype == torch.bfloat16 else {}))
    # Only this run's names: the other pytest worker's runs may hold segments of their own in /dev/shm right now.
    assert [n for n in os.listdir(SHM_DIR) if n.startswith(segment_prefix(tmp_path / "out"))] == []


def _fallback(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    answer = open_segment(1024, rank, world, shm_dir=f"{out}-no-such-dir")
    Path(f"{out}.{rank}").write_text(answer if isinstance(answer, str) else "a segment")
    dist.destroy_process_group()


def test_no_room_for_the_segment_falls_back_on_every_rank_alike(tmp_path: Path):
    _spawn(_fallback, (2, str(tmp_path / "store"), str(tmp_path / "out")), 2)
    reasons = [(tmp_path / f"out.{r}").read_text() for r in range(2)]
    assert reasons[0] == reasons[1] and "no-such-dir" in reasons[0] and "No such file" in reasons[0]


def _full(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    answer = open_segment(4 * 2**20, rank, world, shm_dir=out)  # 2 slots of 4 MiB in a 1 MiB tmpfs
    Path(f"{out}.{rank}").write_text(answer if isinstance(answer, str) else "a segment")
    dist.destroy_process_group()


def test_a_full_dev_shm_falls_back_on_every_rank_and_leaves_nothing(tmp_path: Path):
    """A container's small /dev/shm, for real: a 1 MiB tmpfs (root mounts it, as CI runs)."""
    small = tmp_path / "small-shm"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True)
    try:
        _spawn(_full, (2, str(tmp_path / "store"), str(small)), 2)
        assert os.listdir(small) == [], "the half-made segment was left behind"
    finally:
        subprocess.run(["umount", str(small)], check=True)
    reasons = [Path(f"{small}.{r}").read_text() for r in range(2)]
    assert reasons[0] == reasons[1] and "No space left on device" in reasons[0], reasons


def _dies(rank: int, world: int, store: str, out: str) -> None:  # a module-level target: spawn pickles it
    _init(rank, world, store, timeout_s=3600)  # far past the test's deadline: only the dead peer can fail it
    seg = open_segment(4 * 1024, rank, world)
    assert not isinstance(seg, str), seg
    seg.allreduce_mean_(torch.ones(1024))
    if rank == 1:
        os._exit(17)  # dies between two gradient averages, as a killed rank does
    try:
        seg.allreduce_mean_(torch.ones(1024))
        outcome = "returned"
    except Exception as exc:  # which error gloo raises is its business; that it raises is ours
        outcome = f"raised {type(exc).__name__}: {exc}"
    Path(f"{out}.{rank}").write_text(outcome)
    os._exit(0)


def test_a_rank_that_dies_fails_the_others_instead_of_hanging_them(tmp_path: Path):
    ctx = mp.get_context("spawn")  # not mp.spawn, which would SIGTERM rank 0 as soon as rank 1 dies
    ranks = [ctx.Process(target=_dies, args=(r, 2, str(tmp_path / "store"), str(tmp_path / "out"))) for r in range(2)]
    try:
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(120)  # a rank still waiting then waits for its process group's timeout: it hangs
    finally:  # a rank that hangs is the failure this test looks for: it must not outlive the test
        for p in ranks:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert [p.exitcode for p in ranks] == [0, 17]
    outcome = (tmp_path / "out.0").read_text()
    assert outcome.startswith("raised"), outcome


def _fails_while_mapping(rank: int, world: int, store: str, run: str, how: str) -> None:
    """Rank 0 of a run whose collective fails (``how``: "raise", or "kill" for SIGKILL) after the segment is made."""
    _init(rank, world, store)

    def fails(*args, **kwargs):
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("another rank is gone")

    dist.all_reduce = fails  # the collective between making the segment and unlinking it
    try:
        open_segment(4096, rank, world, run=run)
    except RuntimeError as exc:
        assert str(exc) == "another rank is gone"
        os._exit(3)
    os._exit(0)


def _opens(rank: int, world: int, store: str, run: str) -> None:
    _init(rank, world, store)
    assert not isinstance(open_segment(4096, rank, world, run=run), str)
    dist.destroy_process_group()


def test_a_run_that_fails_or_is_killed_while_mapping_leaves_no_segment_behind(tmp_path: Path):
    """An exception between making the segment and unlinking it unlinks it; a SIGKILL there leaves it, and the
    next run of the same output directory removes it, and only it (another run's segment stays). Only names of
    this test's runs are looked at: other processes may have segments of their own in /dev/shm."""
    run, other = tmp_path / "run", tmp_path / "other-run"
    ours = lambda: sorted(n for n in os.listdir(SHM_DIR) if n.startswith(segment_prefix(run)))  # noqa: E731
    ctx = mp.get_context("spawn")  # not mp.spawn, which raises for a process that exits non-zero
    stranger = Path(SHM_DIR) / f"{segment_prefix(other)}left"
    stranger.touch()
    try:
        for how, exit_code in (("raise", 3), ("kill", -signal.SIGKILL)):
            rank = ctx.Process(target=_fails_while_mapping, args=(0, 1, str(tmp_path / f"store-{how}"), str(run), how))
            rank.start()
            rank.join(120)
            if rank.is_alive():  # hung: it must not outlive the test
                rank.kill()
                rank.join(10)
            assert rank.exitcode == exit_code
            assert len(ours()) == (1 if how == "kill" else 0), ours()
        _spawn(_opens, (1, str(tmp_path / "store-next"), str(run)), 1)
        assert ours() == [] and stranger.exists()
    finally:
        stranger.unlink(missing_ok=True)
        for name in ours():
            os.unlink(Path(SHM_DIR) / name)


def test_chunks_cover_every_element_once():
    for numel in (0, 1, 2, 3, 10_007):
        for parts in (1, 2, 3, 4):
            chunks = chunk_bounds(numel, parts)
            assert chunks[0][0] == 0 and chunks[-1][1] == numel
            assert all(a == prev_b for (a, _), (_, prev_b) in zip(chunks[1:], chunks[:-1]))
            assert max(b - a for a, b in chunks) - min(b - a for a, b in chunks) <= 1


def test_shared_memory_needs_gloo_on_cpu_and_every_rank_here():
    assert why_not_shared_memory("gloo", "cpu", 2, 2) is None and why_not_shared_memory("gloo", "cpu", 4, 4) is None
    assert why_not_shared_memory("gloo", "cpu", 1, 1) == "1 ranks, 1 on this host"  # one process: nothing to average
    assert why_not_shared_memory("gloo", "cpu", 2, 1) == "2 ranks, 1 on this host"  # two hosts, one rank each
    assert why_not_shared_memory("nccl", "cuda", 2, 2) == "the nccl backend on cuda reduces on its own"

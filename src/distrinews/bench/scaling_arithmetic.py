"""The arithmetic of ``distrinews bench scaling``: speedup and efficiency against the baseline worker count,
the per-worker batch of weak and strong scaling, and the disjoint core sets the workers are pinned to. Pure
functions, shared by the command (which checks its input with them before any worker starts), the workers
and the tests.
"""

from __future__ import annotations

from typing import Any


def speedup(samples_per_s: float, baseline_samples_per_s: float) -> float:
    return samples_per_s / baseline_samples_per_s if baseline_samples_per_s > 0 else float("nan")


def efficiency(speedup_value: float, workers: int, baseline_workers: int = 1) -> float:
    """Speedup over the ideal speedup ``workers / baseline_workers``."""
    return speedup_value / (workers / baseline_workers)


def per_worker_batch(mode: str, batch: int, global_batch: int | None, workers: int) -> int:
    """Weak: every worker keeps ``batch``. Strong: ``global_batch`` shared out (must divide evenly)."""
    if mode == "weak":
        return batch
    if mode != "strong":
        raise ValueError(f"mode must be weak or strong, not {mode!r}")
    if global_batch is None or global_batch % workers:
        raise ValueError(
            f"strong scaling needs a global batch divisible by every worker count (got {global_batch} for {workers})"
        )
    return global_batch // workers


def core_slices(cores: list[int], workers: int, cores_per_worker: int) -> list[list[int]]:
    """Disjoint core sets, one per local rank; fails when the machine has too few cores."""
    need = workers * cores_per_worker
    if need > len(cores):
        raise ValueError(
            f"{workers} workers x {cores_per_worker} cores need {need} "
            f"cores; this process may use {len(cores)} ({cores})"
        )
    return [cores[i * cores_per_worker : (i + 1) * cores_per_worker] for i in range(workers)]


def summarize(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add speedup and efficiency to each point, against the point with the fewest workers."""
    if not points:
        return []
    base = min(points, key=lambda p: (p["workers"], p.get("bucket_cap_mb") or 0))
    n0 = base["workers"]
    speedups = [speedup(p["samples_per_s"], base["samples_per_s"]) for p in points]
    return [
        {**p, "speedup": s, "efficiency": efficiency(s, p["workers"], n0), "baseline_workers": n0}
        for p, s in zip(points, speedups)
    ]

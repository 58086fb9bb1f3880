"""What this machine is: its CPU, the cores this process may use, its accelerators, the versions (``describe``,
for every benchmark report and ``distrinews doctor``), and each process's share of the cores.

The cores a process may use (``usable_cores``, what every thread pool and the server's lanes are sized from) are
its affinity's, and no more than its CPU quota allows: a container run with ``--cpus 2`` on a 64-core host sees all
64 in its affinity, and 64 threads would share 2 cores' worth of time.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
from pathlib import Path
from typing import Any

# Where /proc and /sys are read from (tests point it at fake cgroup files).
SYSTEM_ROOT = Path("/")
# cgroup v1 mounts the cpu controller alone or joined with cpuacct, under either order of the two names.
CGROUP_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
# /proc/self/cgroup and the quota files are a few lines; a larger one is not what it claims to be.
CGROUP_FILE_LIMIT = 64 * 1024


def cores_available() -> list[int]:
    """The CPU cores this process may run on (its affinity), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def _small_file(path: Path) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError), open(path, "rb") as f:
        return f.read(CGROUP_FILE_LIMIT).decode()
    return None


def _v2_quota(directory: Path) -> float | None:
    """cgroup v2's ``cpu.max``: "QUOTA PERIOD" in microseconds, or "max PERIOD" for no quota."""
    fields = (_small_file(directory / "cpu.max") or "").split()
    with contextlib.suppress(ValueError, ZeroDivisionError):
        return int(fields[0]) / int(fields[1]) if len(fields) == 2 and fields[0] != "max" else None
    return None


def _v1_quota(directory: Path) -> float | None:
    """cgroup v1's ``cpu.cfs_quota_us`` (-1: no quota) over ``cpu.cfs_period_us``."""
    with contextlib.suppress(ValueError, ZeroDivisionError):
        quota = int((_small_file(directory / "cpu.cfs_quota_us") or "-1").strip())
        period = int((_small_file(directory / "cpu.cfs_period_us") or "0").strip())
        return quota / period if quota > 0 and period > 0 else None
    return None


def _cgroup_dirs(mount: Path, cgroup: str) -> list[Path]:
    """The folders of ``cgroup`` (as /proc/self/cgroup names it) and every cgroup above it under ``mount``, the mount
    itself included (in a container often its own cgroup, where the named path does not exist)."""
    parts = [p for p in cgroup.split("/") if p and p not in (".", "..")]
    return [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cpu_quota(root: Path | None = None) -> float | None:
    """The CPUs' worth of time this process's cgroups allow (``--cpus 1.5``: 1.5), the tightest of its cgroup and those
    above it, v2 or v1; None when none sets one or can be read. ``root``: where /proc and /sys are."""
    root = SYSTEM_ROOT if root is None else root
    # No /proc/self/cgroup (another OS, a sandbox): the root cgroups of both versions, as a container sees its own.
    cgroups = (_small_file(root / "proc/self/cgroup") or "0::/\n1:cpu:/\n").splitlines()
    base = root / "sys/fs/cgroup"
    quotas: list[float] = []
    for line in cgroups:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and not controllers:
            quotas += filter(None, map(_v2_quota, _cgroup_dirs(base, path)))
        elif "cpu" in controllers.split(","):
            for mount in CGROUP_V1_CPU_MOUNTS:
                quotas += filter(None, map(_v1_quota, _cgroup_dirs(base / mount, path)))
    return min(quotas, default=None)


def usable_cores(root: Path | None = None) -> int:
    """How many cores this process can keep busy: its affinity's, at most its CPU quota rounded up (a quota of
    1.5 CPUs keeps two threads busy part of the time). What thread pools and the server's lanes are sized from."""
    affinity = len(cores_available())
    quota = cpu_quota(root)
    return affinity if quota is None else max(1, min(affinity, math.ceil(quota)))


def quota_limited_cores(root: Path | None = None) -> int | None:
    """``usable_cores()`` where a CPU quota allows fewer cores than the affinity, else None: a runtime's own default
    (often the physical cores) is better where no quota binds, but it counts the host's cores under ``--cpus``."""
    usable = usable_cores(root)
    return usable if usable < len(cores_available()) else None


def threads_per_process(processes: int) -> int:
    """Each of ``processes`` processes' share of the cores this process can use (``usable_cores``)."""
    return max(1, usable_cores() // max(1, processes))


def _cpuinfo(key: str) -> str | None:
    """The first ``key: value`` of /proc/cpuinfo, None where there is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    return None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown CPU"


def cpu_flags(wanted: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8")) -> list[str]:
    """Which of ``wanted`` the CPU advertises (what decides bf16 speed and int8 kernels)."""
    flags = set((_cpuinfo("flags") or "").split())
    return [f for f in wanted if f in flags]


def describe() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores_available": len(cores_available()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def bf16_is_fast(device: Any) -> bool:
    """Whether ``device`` computes bf16 matmuls in hardware (``bf16: auto``): a CPU without AVX512-BF16 or AMX
    converts each to fp32 in software, 0.9 GFLOP/s against 89 in fp32 on an AVX2 EPYC (benchmarks/README.md)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def bf16_attention_is_fast(device: Any) -> bool:
    """Whether torch's fused bf16 attention kernel is fast on ``device`` (``fp32_attention: auto``): on a CPU it
    packs bf16 blocks for AMX tiles, and without AMX its backward is about 4x slower than in fp32 (an EPYC with
    AVX512-BF16, MiniLM at 48 tokens: 43.6 ms against 11.4 ms, benchmarks/README.md section 21)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return True
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return device.type == "cpu" and check is not None and bool(check())

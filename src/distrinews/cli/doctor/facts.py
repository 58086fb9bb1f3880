"""Facts ``distrinews doctor`` reports about this machine before any rank starts: the versions (Python, torch,
CUDA, cuDNN, NCCL, transformers, distrinews), the CPU and GPUs, the distributed backends this torch build has,
and whether a rendezvous port can be bound (and who holds it when it cannot).
"""

from __future__ import annotations

import socket
from typing import Any


def versions() -> dict[str, Any]:
    import platform

    import torch
    import torch.distributed as dist
    import transformers

    from ...version import __version__

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
        "transformers": transformers.__version__,
        "distrinews": __version__,
    }
    if torch.cuda.is_available():
        info["cudnn"] = torch.backends.cudnn.version()
        if dist.is_nccl_available():
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return info


def devices() -> dict[str, Any]:
    import torch

    from ...distributed.machine import describe

    machine = describe()
    out: dict[str, Any] = {key: machine[key] for key in ("cpu", "cores_available", "cpu_capability")}
    gpus = range(torch.cuda.device_count()) if torch.cuda.is_available() else range(0)
    props = [torch.cuda.get_device_properties(i) for i in gpus]
    out["cuda_devices"] = [
        dict(index=i, name=p.name, memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}")
        for i, p in enumerate(props)
    ]
    return out


def backends() -> dict[str, bool]:
    import torch
    import torch.distributed as dist

    return {
        "distributed": dist.is_available(),
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
        "cuda": torch.cuda.is_available(),
    }


def port_owner(port: int) -> str | None:
    """Who listens on ``port`` (pid and command), when the OS lets us see it."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                p = psutil.Process(c.pid)
                return f"pid {c.pid} ({' '.join(p.cmdline())[:120]})"
    except (psutil.Error, OSError):
        return None
    return None


def port_free(host: str, port: int) -> tuple[bool, str | None]:
    """Whether ``port`` can be bound on ``host`` (what rank 0's store will do), and the OS's reason if not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return False, exc.strerror or str(exc)
    return True, None

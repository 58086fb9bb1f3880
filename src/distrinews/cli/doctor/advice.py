"""What ``distrinews doctor`` tells a person to do about a failure: a port already in use, ranks that never
joined the rendezvous, a timeout, an NCCL error, or anything else, each turned into steps to take. Text only.
"""

from __future__ import annotations


def advise(phase: str, error: str, host: str, port: int, timeout_s: float, missing: list[int]) -> str:
    """Turn a failure into what to do about it."""
    low = error.lower()
    if "address already in use" in low or "eaddrinuse" in low or "errno 98" in low:
        return (
            f"port {port} on {host} is already in use. Another run (or a zombie process from one) holds it: "
            f"find it with `ss -ltnp | grep :{port}` and stop it, or pick another port (--port, or MASTER_PORT "
            "/ torchrun --master-port). `distrinews train --nproc-per-node N` picks a free port by itself."
        )
    if missing:
        who = ", ".join(map(str, missing))
        return (
            f"rank(s) {who} never joined the rendezvous at {host}:{port} within {timeout_s:g}s. Check that "
            "every node started its processes (same --nnodes and --nproc-per-node everywhere, same "
            f"MASTER_ADDR:MASTER_PORT), that no rank crashed at start-up (its log), and that {host}:{port} "
            "is reachable from every node (firewall, GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for the "
            "right network interface). If the nodes are just slow to start, raise the timeout."
        )
    if "timed out" in low or "timeout" in low:
        return (
            f"the rendezvous at {host}:{port} timed out after {timeout_s:g}s during '{phase}'. Check MASTER_ADDR is an "
            f"address every node can reach, that no firewall blocks port {port}, and the interface (GLOO_SOCKET_IFNAME "
            "/ NCCL_SOCKET_IFNAME); run with NCCL_DEBUG=INFO or TORCH_DISTRIBUTED_DEBUG=DETAIL for more."
        )
    if "nccl" in low:
        return (
            "NCCL failed: check every process sees its GPU (CUDA_VISIBLE_DEVICES, nvidia-smi), that the driver, CUDA "
            "and NCCL versions match on all nodes, and rerun with NCCL_DEBUG=INFO."
        )
    return f"'{phase}' failed: {error}. Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL for more."

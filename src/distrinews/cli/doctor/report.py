"""The checklist ``distrinews doctor`` prints: ``Report`` keeps each ``[ OK ]`` and ``[FAIL]`` line (printed as
it comes), the advice for each failure and the data for ``--json``; ``report_facts`` adds the machine's facts
(failing where torch has no usable backend) and ``report_results`` the ranks' answers and bandwidth; ``advise``
turns a failure (a port in use, ranks that never joined, a timeout, an NCCL error, anything else) into steps to take.
"""

from __future__ import annotations

from typing import Any

from .facts import backends, devices, versions


class Report:
    """The checklist as it is printed: its lines, the advice for each failure, and the data ``--json`` writes."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failures: list[str] = []
        self.data: dict[str, Any] = {}

    def ok(self, what: str) -> None:
        self.lines.append(f"[ OK ] {what}")
        print(self.lines[-1], flush=True)

    def info(self, what: str) -> None:
        self.lines.append(f"       {what}")
        print(self.lines[-1], flush=True)

    def fail(self, what: str, advice: str) -> None:
        self.lines.append(f"[FAIL] {what}")
        self.failures.append(advice)
        print(self.lines[-1], flush=True)


def report_facts(rep: Report) -> None:
    """Versions, devices and backends; a failure when this torch build cannot run a distributed job."""
    v, d, b = versions(), devices(), backends()
    rep.data.update(versions=v, devices=d, backends=b)
    rep.ok(f"python {v['python']}, torch {v['torch']}, transformers {v['transformers']}, distrinews {v['distrinews']}")
    rep.info(f"CUDA {v['cuda'] or 'none (CPU build)'}, cuDNN {v['cudnn'] or '-'}, NCCL {v['nccl'] or '-'}")
    rep.info(f"CPU: {d['cpu']} ({d['cores_available']} cores available to this process, {d['cpu_capability']})")
    for g in d["cuda_devices"]:
        rep.info(f"GPU {g['index']}: {g['name']} ({g['memory_gib']} GiB, compute capability {g['capability']})")
    if not d["cuda_devices"]:
        rep.info("GPU: none visible (training uses gloo on CPU)")
    rep.info("backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in b.items()))
    if not b["distributed"] or not (b["gloo"] or b["nccl"]):
        rep.fail(
            "this torch build has no usable distributed backend",
            "install a torch build with distributed support (the official wheels have gloo; CUDA wheels add nccl)",
        )
    elif b["cuda"] and not b["nccl"]:
        rep.fail(
            "CUDA is available but NCCL is not", "install a CUDA build of torch with NCCL, or train on CPU with gloo"
        )


def report_results(rep: Report, results: list[dict[str, Any]], world: int) -> None:
    """Every rank's results: the rendezvous, each collective's answer (a failure naming the wrong ranks), the
    bandwidth."""
    first = results[0]
    rep.ok(
        f"rendezvous of {world} processes ({first['backend']}, "
        f"{first['device']} on rank 0) in {first['rendezvous_s']:.2f}s"
    )
    for name in ("all_reduce", "all_gather", "broadcast"):
        bad = [r["rank"] for r in results if not r["checks"][name]["ok"]]
        c = first["checks"][name]
        if bad:
            got = {r["rank"]: r["checks"][name]["got"] for r in results}
            rep.fail(
                f"{name} gave the wrong answer on rank(s) {bad}: got {got}, expected {c['expected']}",
                f"{name} returned wrong values: the processes disagree about the group (mixed torch versions across "
                f"nodes?) or the network corrupts data; rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL",
            )
        else:
            rep.ok(f"{name} correct on every rank (got {c['got']}, expected {c['expected']})")
    bw = first.get("bandwidth")
    if bw is None:
        rep.info("no all_reduce bandwidth with one process: nothing crosses a link (start 2 or more with --nproc)")
    else:
        rep.ok(
            f"all_reduce of {bw['bytes'] / 2**20:.0f} MiB: {bw['time_ms']:.3g} ms, algbw {bw['algbw'] / 1e9:.2f} GB/s, "
            f"busbw {bw['busbw'] / 1e9:.2f} GB/s (full table: distrinews bench collectives)"
        )
    shm = first.get("shared_memory") or {"used": False, "why": "not checked"}
    if shm["used"]:
        bad = [r["rank"] for r in results if not r["shared_memory"]["ok"]]
        if bad:
            rep.fail(
                f"the shared-memory gradient average gave the wrong answer on rank(s) {bad}: got "
                f"{ {r['rank']: r['shared_memory']['got'] for r in results} }, expected {shm['expected']}",
                "train with --ddp_comm_hook none (gloo's all-reduce) and "
                "report this with the output of distrinews doctor --json",
            )
        else:
            rep.ok(
                f"shared-memory gradient average of {shm['bytes'] / 2**20:.0f} MiB (what training "
                f"uses here, ddp_comm_hook auto): {shm['time_ms']:.1f} ms, correct on every rank"
            )
    elif "needs_bytes" in shm:
        rep.info(
            f"no shared-memory gradient average: {shm['why']}; training averages through "
            f"{first['backend']} instead (slower on one host). {shm['bytes'] / 2**20:.0f} MiB of "
            f"gradients need {shm['needs_bytes'] / 2**20:.0f} MiB of /dev/shm: give a container "
            "a larger one (docker --shm-size, a memory-backed emptyDir as deploy/k8s has)"
        )
    else:
        rep.info(f"no shared-memory gradient average ({shm['why']}): training averages through {first['backend']}")
    rep.data["rendezvous"] = results


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

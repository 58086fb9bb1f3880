"""``distrinews doctor``: the seed's debugging checklist as a command.

Versions (torch, CUDA, NCCL), devices, the backends this build has, a free port, a real
rendezvous of N processes with every collective checked for the right answer, and a short
all-reduce bandwidth figure. Exits 1 with advice a person can act on when something fails.

Two ways to run it:
- ``distrinews doctor [--nproc N] [--port P] [--timeout S]``: this process starts the N ranks
  itself (the environment torchrun would give them), so it can tell a port already in use, a
  rank that never joined and a rank that crashed apart, and say which.
- ``distrinews doctor --nproc-per-node N``: the command re-launches itself under torchrun (as
  training does), so the check goes through the launcher you will train with; rank 0 reports.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ...distributed.machine import threads_per_process

EXIT_OK, EXIT_FAIL = 0, 1


# ---------------------------------------------------------------------- facts about this machine
def versions() -> dict[str, Any]:
    import platform

    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "nccl": None,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        info["transformers"] = None
    from ... import __version__

    info["distrinews"] = __version__
    if torch.cuda.is_available():
        info["cudnn"] = torch.backends.cudnn.version()
        if dist.is_nccl_available():
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return info


def devices() -> dict[str, Any]:
    import torch

    from ...distributed.machine import cores_available, cpu_model

    out: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores_available": len(cores_available()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_devices": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["cuda_devices"].append(
                {"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "capability": f"{p.major}.{p.minor}"}
            )
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


# ---------------------------------------------------------------------- one rank's checks
def rank_checks(timeout_s: float, bandwidth_bytes: int, report) -> dict[str, Any]:
    """Join the group from the environment, check each collective's answer, time an all-reduce.

    ``report(phase, **data)`` is called as each phase passes, so a parent can tell how far a rank got.
    """
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available() and dist.is_nccl_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        backend, device = "nccl", torch.device("cuda", torch.cuda.current_device())
    else:
        backend, device = "gloo", torch.device("cpu")
    report("rendezvous")
    started = time.perf_counter()
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s), device_id=device if backend == "nccl" else None
    )
    result: dict[str, Any] = {
        "rank": rank,
        "world_size": world,
        "backend": backend,
        "device": str(device),
        "host": socket.gethostname(),
        "rendezvous_s": time.perf_counter() - started,
        "checks": {},
    }
    try:
        report("all_reduce")
        x = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(x)
        expect = world * (world + 1) / 2
        result["checks"]["all_reduce"] = {"ok": bool((x == expect).all()), "got": x[0].item(), "expected": expect}

        report("all_gather")
        out = [torch.zeros(1, device=device) for _ in range(world)]
        dist.all_gather(out, torch.tensor([float(rank)], device=device))
        got = [t.item() for t in out]
        result["checks"]["all_gather"] = {"ok": got == [float(r) for r in range(world)], "got": got, "expected": list(range(world))}

        report("broadcast")
        b = torch.tensor([123.0 if rank == 0 else -1.0], device=device)
        dist.broadcast(b, src=0)
        result["checks"]["broadcast"] = {"ok": b.item() == 123.0, "got": b.item(), "expected": 123.0}

        report("bandwidth")
        payload = torch.ones(max(1, bandwidth_bytes // 4), device=device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        dist.all_reduce(payload)
        sync()
        dist.barrier()
        t = time.perf_counter()
        iters = 5
        for _ in range(iters):
            dist.all_reduce(payload)
        sync()
        seconds = torch.tensor([(time.perf_counter() - t) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        from ...bench.collectives import bandwidths

        alg, bus = bandwidths("all_reduce", payload.numel() * 4, seconds.item(), world)
        result["bandwidth"] = {"bytes": payload.numel() * 4, "time_ms": 1000 * seconds.item(), "algbw": alg, "busbw": bus}
        report("done")
    finally:
        dist.destroy_process_group()
    return result


def _worker_main(argv: list[str]) -> int:
    """A rank started by the parent doctor: write progress and the result to ``--result-dir``."""
    p = argparse.ArgumentParser()
    p.add_argument("--result-dir", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--bandwidth-bytes", type=int, required=True)
    a = p.parse_args(argv)
    rank = int(os.environ["RANK"])
    path = Path(a.result_dir) / f"rank-{rank}.json"
    state: dict[str, Any] = {"rank": rank, "phase": "start"}

    def write(payload: dict[str, Any]) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload))
        os.replace(tmp, path)

    def report(phase: str) -> None:
        state["phase"] = phase
        write(state)

    report("start")
    try:
        result = rank_checks(a.timeout, a.bandwidth_bytes, report)
    except Exception as exc:  # reported to the parent, which turns it into advice
        write({**state, "error": f"{type(exc).__name__}: {exc}"[:2000]})
        return 1
    write({**state, "result": result})
    return 0


# ---------------------------------------------------------------------- diagnosis
def advise(phase: str, error: str, host: str, port: int, timeout_s: float, missing: list[int]) -> str:
    """Turn a failure into what to do about it."""
    low = error.lower()
    if "address already in use" in low or "eaddrinuse" in low or "errno 98" in low:
        return (
            f"port {port} on {host} is already in use. Another run (or a zombie process from one) holds it: find it with "
            f"`ss -ltnp | grep :{port}` and stop it, or pick another port (--port, or MASTER_PORT / torchrun --master-port). "
            f"`distrinews train --nproc-per-node N` picks a free port by itself."
        )
    if missing:
        who = ", ".join(map(str, missing))
        return (
            f"rank(s) {who} never joined the rendezvous at {host}:{port} within {timeout_s:g}s. Check that every node "
            f"started its processes (same --nnodes and --nproc-per-node everywhere, same MASTER_ADDR:MASTER_PORT), that "
            f"no rank crashed at start-up (its log), and that {host}:{port} is reachable from every node (firewall, "
            f"GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for the right network interface). If the nodes are just slow to "
            f"start, raise the timeout."
        )
    if "timed out" in low or "timeout" in low:
        return (
            f"the rendezvous at {host}:{port} timed out after {timeout_s:g}s during '{phase}'. Check MASTER_ADDR is an "
            f"address every node can reach, that no firewall blocks port {port}, and the interface "
            f"(GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME); run with NCCL_DEBUG=INFO or TORCH_DISTRIBUTED_DEBUG=DETAIL for more."
        )
    if "nccl" in low:
        return (
            "NCCL failed: check every process sees its GPU (CUDA_VISIBLE_DEVICES, nvidia-smi), that the driver, CUDA "
            "and NCCL versions match on all nodes, and rerun with NCCL_DEBUG=INFO."
        )
    return f"'{phase}' failed: {error}. Rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL for more."


# ---------------------------------------------------------------------- the command
class Report:
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


def _facts(rep: Report) -> None:
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
        rep.fail("CUDA is available but NCCL is not", "install a CUDA build of torch with NCCL, or train on CPU with gloo")


def _summarize(rep: Report, results: list[dict[str, Any]], world: int) -> None:
    first = results[0]
    rep.ok(f"rendezvous of {world} processes ({first['backend']}, {first['device']} on rank 0) in {first['rendezvous_s']:.2f}s")
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
    bw = first["bandwidth"]
    rep.ok(
        f"all_reduce of {bw['bytes'] / 2**20:.0f} MiB: {bw['time_ms']:.1f} ms, algbw {bw['algbw'] / 1e9:.2f} GB/s, "
        f"busbw {bw['busbw'] / 1e9:.2f} GB/s (full table: distrinews bench collectives)"
    )
    rep.data["rendezvous"] = results


def _parent(args: argparse.Namespace, rep: Report) -> None:
    """Start the ranks ourselves and watch them."""
    import torch

    world = args.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    start_ranks = world if args.start_ranks is None else args.start_ranks
    port = _choose_port(args, rep)
    if port is None:
        return
    procs, hung, states, tails = _run_ranks(args, world, start_ranks, port, rep)
    results = [s["result"] for s in states.values() if s and "result" in s]
    if len(results) == world:
        _summarize(rep, sorted(results, key=lambda r: r["rank"]), world)
        return
    _diagnose(rep, args, world, port, procs, hung, states, tails)


def _choose_port(args: argparse.Namespace, rep: Report) -> int | None:
    """The rendezvous port: the one asked for if it can be bound (else None, with advice), or a free one."""
    host = args.host
    if not args.port:
        from ...distributed.launch import free_port

        port = free_port(host)
        rep.ok(f"free port found: {host}:{port}")
        return port
    free, why = port_free(host, args.port)
    if not free:
        owner = port_owner(args.port)
        rep.fail(
            f"port {args.port} on {host} cannot be bound: {why}" + (f"; held by {owner}" if owner else ""),
            advise("port", "address already in use" if "in use" in (why or "").lower() else (why or ""), host, args.port, args.timeout, []),
        )
        return None
    rep.ok(f"port {args.port} on {host} is free")
    return args.port


def _run_ranks(args: argparse.Namespace, world: int, start_ranks: int, port: int, rep: Report):
    """Start ``start_ranks`` of ``world`` ranks, wait for them (stopping the ones that hang), read what each reported."""
    cores = threads_per_process(world)
    with tempfile.TemporaryDirectory(prefix="distrinews-doctor-") as tmp:
        procs: dict[int, subprocess.Popen] = {}
        logs: dict[int, Any] = {}
        command = [
            sys.executable,
            "-m",
            "distrinews.cli.doctor.checks",
            "--result-dir",
            tmp,
            "--timeout",
            str(args.timeout),
            "--bandwidth-bytes",
            str(int(args.bandwidth_mb * 2**20)),
        ]
        for rank in range(start_ranks):
            env = {
                **os.environ,
                "MASTER_ADDR": args.host,
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world),
                "OMP_NUM_THREADS": str(cores),
            }
            logs[rank] = open(Path(tmp) / f"rank-{rank}.log", "w+")
            procs[rank] = subprocess.Popen(command, env=env, stdout=logs[rank], stderr=subprocess.STDOUT)
        rep.info(f"started {start_ranks} of {world} ranks (rendezvous timeout {args.timeout:g}s)")
        deadline = time.monotonic() + args.timeout + 60  # start-up + rendezvous + checks
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
        hung = [r for r, p in procs.items() if p.poll() is None]
        for r in hung:  # only the ranks we started
            procs[r].terminate()
        for r in hung:
            try:
                procs[r].wait(5)
            except subprocess.TimeoutExpired:
                procs[r].kill()
                procs[r].wait()
        states = {}
        for rank in range(world):
            f = Path(tmp) / f"rank-{rank}.json"
            states[rank] = json.loads(f.read_text()) if f.is_file() else None
        tails = {}
        for rank, log in logs.items():
            log.seek(0)
            tails[rank] = log.read()[-1500:]
            log.close()
    return procs, hung, states, tails


def _diagnose(rep: Report, args: argparse.Namespace, world: int, port: int, procs, hung, states, tails) -> None:
    """Name what went wrong with the ranks that did not all report a result, with advice for each."""
    host = args.host
    not_started = [r for r in range(world) if r not in procs]
    crashed = [r for r in procs if r not in hung and (states[r] is None or ("error" not in states[r] and "result" not in states[r]))]
    errors = {r: s for r, s in states.items() if s and "error" in s}
    stuck = {r: states[r]["phase"] if states[r] else "start" for r in hung}
    missing = sorted(set(not_started) | {r for r in crashed if states[r] is None or states[r]["phase"] in ("start", "rendezvous")})
    for r in crashed:
        rep.fail(
            f"rank {r} exited (code {procs[r].returncode}) in phase '{states[r]['phase'] if states[r] else 'start'}' without a result",
            f"rank {r} crashed: read its output below, fix that error, then rerun.\n--- rank {r} output ---\n{tails[r]}",
        )
    for r, phase in stuck.items():
        rep.fail(
            f"rank {r} hung in phase '{phase}' past the deadline and was stopped",
            advise(phase, "timed out", host, port, args.timeout, missing),
        )
    if errors:
        r, s = next(iter(sorted(errors.items())))
        rep.fail(
            f"rank(s) {sorted(errors)} failed in phase '{s['phase']}': {s['error'].splitlines()[0][:300]}",
            advise(s["phase"], s["error"], host, port, args.timeout, missing),
        )
    if not_started and not errors and not stuck:
        rep.fail(f"rank(s) {not_started} never joined", advise("rendezvous", "", host, port, args.timeout, missing))
    rep.data["rank_states"] = states


def _under_torchrun(args: argparse.Namespace, rep: Report) -> int:
    """Every rank of a torchrun job runs this; rank 0 reports."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        result = rank_checks(args.timeout, int(args.bandwidth_mb * 2**20), lambda phase: None)
    except Exception as exc:
        print(f"[FAIL] rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        print(
            "advice: "
            + advise("rendezvous", str(exc), os.environ.get("MASTER_ADDR", "?"), int(os.environ.get("MASTER_PORT", 0)), args.timeout, []),
            file=sys.stderr,
        )
        return EXIT_FAIL
    results = [result]
    # Rank 0 speaks for the group: its all_reduce and all_gather answers already prove that every
    # rank took part with the right values; each rank also exits non-zero on a wrong answer of its own.
    if rank == 0:
        ok = all(c["ok"] for c in result["checks"].values())
        rep.ok(
            f"torchrun launched {world} processes "
            f"(MASTER_ADDR={os.environ.get('MASTER_ADDR')}, MASTER_PORT={os.environ.get('MASTER_PORT')})"
        )
        _summarize(rep, results, world)
        if not ok:
            return EXIT_FAIL
    return EXIT_FAIL if not all(c["ok"] for c in result["checks"].values()) else EXIT_OK


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ...config import ConfigError
    from ...distributed.launch import under_torchrun

    if extra:
        raise ConfigError(f"doctor: unexpected arguments: {' '.join(extra)}")
    if args.nproc is not None and args.nproc < 1:
        raise ConfigError("doctor: --nproc must be >= 1")
    if args.start_ranks is not None and not 0 <= args.start_ranks <= (args.nproc or 2):
        raise ConfigError("doctor: --start-ranks must be between 0 and --nproc")
    rep = Report()
    torchrun_rank = int(os.environ.get("RANK", "0")) if under_torchrun() else 0
    if torchrun_rank == 0:
        print("distrinews doctor", flush=True)
        _facts(rep)
    if under_torchrun():
        code = _under_torchrun(args, rep)
        if torchrun_rank != 0:
            return code
        code = code or (EXIT_FAIL if rep.failures else EXIT_OK)
    else:
        if not rep.failures:
            _parent(args, rep)
        code = EXIT_FAIL if rep.failures else EXIT_OK
    if rep.failures:
        print("\nWhat to do:", flush=True)
        for i, advice in enumerate(rep.failures, 1):
            print(f"  {i}. {advice}", flush=True)
    else:
        print("\nAll checks passed.", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"ok": code == EXIT_OK, "lines": rep.lines, "advice": rep.failures, **rep.data}, indent=2, default=str)
        )
    return code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=None, help="ranks to start (default: GPUs, or 2 on CPU)")
    p.add_argument("--host", default="127.0.0.1", help="rendezvous address (MASTER_ADDR)")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (default: a free one)")
    p.add_argument("--timeout", type=float, default=60.0, help="rendezvous and collective timeout, seconds")
    p.add_argument("--bandwidth-mb", type=float, default=16.0, help="all-reduce size for the bandwidth figure (MiB)")
    p.add_argument("--start-ranks", type=int, default=None, help="start only the first K ranks (rehearse a rank that never joins)")
    p.add_argument("--json", help="also write the findings here")


if __name__ == "__main__":
    raise SystemExit(_worker_main(sys.argv[1:]))

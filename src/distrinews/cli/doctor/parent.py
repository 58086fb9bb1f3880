"""``distrinews doctor`` without torchrun (the first way of ``checks``): this process picks the rendezvous port (the
one asked for if it can be bound, or a free one), starts the ranks, waits for them (stopping any that hang past the
deadline) and reads what each reported, to tell the ways they fail apart, with advice for each."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from ...distributed.lifetime import log_tail, stop_processes
from ...distributed.machine import threads_per_process
from .facts import port_free, port_owner
from .report import Report, advise, report_results

# What a rank wrote to its rank-N.json (its phase, then its result or error), None when it wrote nothing.
RankState = dict[str, Any] | None


class _Ranks(NamedTuple):
    procs: dict[int, subprocess.Popen[bytes]]  # the ranks started, by rank
    hung: list[int]  # those still running at the deadline, stopped
    states: dict[int, RankState]  # every rank of the world
    tails: dict[int, str]  # the end of each started rank's output


def run_parent(args: argparse.Namespace, rep: Report) -> None:
    """Start the ranks ourselves and watch them."""
    import torch

    world = args.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    start_ranks = world if args.start_ranks is None else args.start_ranks
    port = _choose_port(args, rep)
    if port is None:
        return
    ranks = _run_ranks(args, world, start_ranks, port, rep)
    results = [s["result"] for s in ranks.states.values() if s and "result" in s]
    if len(results) == world:
        report_results(rep, sorted(results, key=lambda r: r["rank"]), world)
        return
    _diagnose(rep, args, world, port, ranks)


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
        error = "address already in use" if "in use" in (why or "").lower() else (why or "")
        rep.fail(
            f"port {args.port} on {host} cannot be bound: {why}" + (f"; held by {owner}" if owner else ""),
            advise("port", error, host, args.port, args.timeout, []),
        )
        return None
    rep.ok(f"port {args.port} on {host} is free")
    return int(args.port)


def _run_ranks(args: argparse.Namespace, world: int, start_ranks: int, port: int, rep: Report) -> _Ranks:
    """Start ``start_ranks`` of ``world`` ranks, wait for them (stopping the ones that hang), read what each
    reported."""
    cores = threads_per_process(world)
    with tempfile.TemporaryDirectory(prefix="distrinews-doctor-") as tmp:
        procs: dict[int, subprocess.Popen[bytes]] = {}
        logs: dict[int, TextIO] = {}
        command = [sys.executable, "-m", "distrinews.cli.doctor.checks", "--result-dir", tmp]
        command += ["--timeout", str(args.timeout), "--bandwidth-bytes", str(int(args.bandwidth_mb * 2**20))]
        for rank in range(start_ranks):
            env = {**os.environ, "MASTER_ADDR": args.host, "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(cores)}
            env.update({name: str(rank) for name in ("RANK", "LOCAL_RANK")})
            env.update({name: str(world) for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE")})
            logs[rank] = open(Path(tmp) / f"rank-{rank}.log", "w+")
            procs[rank] = subprocess.Popen(command, env=env, stdout=logs[rank], stderr=subprocess.STDOUT)
        rep.info(f"started {start_ranks} of {world} ranks (rendezvous timeout {args.timeout:g}s)")
        deadline = time.monotonic() + args.timeout + 60  # start-up + rendezvous + checks
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(0.2)
        hung = [r for r, p in procs.items() if p.poll() is None]
        stop_processes(*(procs[r] for r in hung), grace_s=5)  # only the ranks we started
        files = {rank: Path(tmp) / f"rank-{rank}.json" for rank in range(world)}
        states = {rank: json.loads(f.read_text()) if f.is_file() else None for rank, f in files.items()}
        for log in logs.values():
            log.close()
        tails = {rank: log_tail(Path(log.name), lines=None, max_bytes=1500) for rank, log in logs.items()}
    return _Ranks(procs, hung, states, tails)


def _diagnose(rep: Report, args: argparse.Namespace, world: int, port: int, ranks: _Ranks) -> None:
    """Name what went wrong with the ranks that did not all report a result, with advice for each."""
    procs, hung, states, tails = ranks
    host = args.host
    not_started = [r for r in range(world) if r not in procs]
    crashed = [
        r
        for r in procs
        if r not in hung and ((state := states[r]) is None or ("error" not in state and "result" not in state))
    ]
    errors = {r: s for r, s in states.items() if s and "error" in s}
    stuck = {r: _phase(states[r]) for r in hung}
    missing = sorted(
        set(not_started)
        | {r for r in crashed if (state := states[r]) is None or state["phase"] in ("start", "rendezvous")}
    )
    for r in crashed:
        rep.fail(
            f"rank {r} exited (code {procs[r].returncode}) in phase '{_phase(states[r])}' without a result",
            f"rank {r} crashed: read its output below, fix that error, then rerun.\n--- rank {r} output "
            f"---\n{tails[r]}",
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


def _phase(state: RankState) -> str:
    """The last phase a rank reported reaching."""
    return state["phase"] if state else "start"

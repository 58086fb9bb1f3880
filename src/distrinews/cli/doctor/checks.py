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

This module is the command and the checklist's order; the checks are in ``facts`` (versions,
devices, backends, ports), ``rank`` (one rank's collectives; ``python -m
distrinews.cli.doctor.checks`` runs one for the parent), ``parent`` (starting and watching the
ranks) and ``report`` (the printed lines and the advice).
"""

from __future__ import annotations

import argparse
import os
import sys

from ...options import Option, check_options
from ..common import no_extra_arguments, write_json
from .facts import port_free
from .parent import run_parent
from .rank import rank_checks, worker_main
from .report import Report, advise, report_facts, report_results

EXIT_OK, EXIT_FAIL = 0, 1

__all__ = ["EXIT_FAIL", "EXIT_OK", "advise", "port_free", "run"]  # what the doctor's tests call


def _under_torchrun(args: argparse.Namespace, rep: Report) -> int:
    """Every rank of a torchrun job runs this; rank 0 reports."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        result = rank_checks(args.timeout, int(args.bandwidth_mb * 2**20), lambda phase: None)
    except Exception as exc:
        print(f"[FAIL] rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        host, port = os.environ.get("MASTER_ADDR", "?"), int(os.environ.get("MASTER_PORT", 0))
        print("advice: " + advise("rendezvous", str(exc), host, port, args.timeout, []), file=sys.stderr)
        return EXIT_FAIL
    # Rank 0 speaks for the group: its all_reduce and all_gather answers already prove that every
    # rank took part with the right values; each rank also exits non-zero on a wrong answer of its own.
    if rank == 0:
        rep.ok(
            f"torchrun launched {world} processes "
            f"(MASTER_ADDR={os.environ.get('MASTER_ADDR')}, MASTER_PORT={os.environ.get('MASTER_PORT')})"
        )
        report_results(rep, [result], world)
    return EXIT_OK if all(c["ok"] for c in result["checks"].values()) else EXIT_FAIL


def run(args: argparse.Namespace, extra: list[str]) -> int:
    from ...config import ConfigError
    from ...distributed.launch import launch, under_torchrun, wants_launch

    if wants_launch(args.launch_flags):  # `--nproc-per-node N`: this command again, under torchrun
        return launch(args.launch_flags, args.argv)
    no_extra_arguments("doctor", extra)
    check_options(args, OPTIONS, ConfigError, prefix="doctor: ")
    if args.start_ranks is not None and not 0 <= args.start_ranks <= (args.nproc or 2):
        raise ConfigError("doctor: --start-ranks must be between 0 and --nproc")
    rep = Report()
    torchrun_rank = int(os.environ.get("RANK", "0")) if under_torchrun() else 0
    if torchrun_rank == 0:
        print("distrinews doctor", flush=True)
        report_facts(rep)
    if under_torchrun():
        code = _under_torchrun(args, rep)
        if torchrun_rank != 0:
            return code
        code = code or (EXIT_FAIL if rep.failures else EXIT_OK)
    else:
        if not rep.failures:
            run_parent(args, rep)
        code = EXIT_FAIL if rep.failures else EXIT_OK
    if rep.failures:
        print("\nWhat to do:", flush=True)
        for i, advice in enumerate(rep.failures, 1):
            print(f"  {i}. {advice}", flush=True)
    else:
        print("\nAll checks passed.", flush=True)
    if args.json:
        write_json(args.json, {"ok": code == EXIT_OK, "lines": rep.lines, "advice": rep.failures, **rep.data})
    return code


OPTIONS = [
    Option("nproc", help="ranks to start (default: GPUs, or 2 on CPU)", type=int, minimum=1),
    Option("host", "127.0.0.1", "rendezvous address (MASTER_ADDR)"),
    Option("port", 0, "rendezvous port (default: a free one)", minimum=0, maximum=65535),
    Option("timeout", 60.0, "rendezvous and collective timeout, seconds", above=0),
    Option("bandwidth_mb", 16.0, "all-reduce size for the bandwidth figure (MiB)", above=0),
    Option("start_ranks", help="start only the first K ranks (rehearse a rank that never joins)", type=int, minimum=0),
    Option("json", help="also write the findings here"),
]


if __name__ == "__main__":
    raise SystemExit(worker_main(sys.argv[1:]))

"""Our launcher: ``--nproc-per-node``, ``--nnodes``, ``--rdzv-endpoint``, ``--max-restarts`` ... on our own command.

The command runs torchrun's elastic agent *in this process*, not as a child: killing the command, even with SIGKILL,
takes the workers with it (``process_group.die_with_launcher``), and a failed run ends in one line of ours instead of
torchrun's traceback. Flags not given are taken from torchrun's ``PET_*`` variables, as torchrun does, so operators
that set them (Kubeflow Trainer, the PyTorch training operator) need no change to the command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PREFIX, one_line

if TYPE_CHECKING:
    from .rollcall import RollCall

# torchrun options our commands pass through (dashes; underscores are accepted on input).
LAUNCH_FLAGS = (
    "local-addr",
    "nproc-per-node",
    "nnodes",
    "node-rank",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-backend",
    "rdzv-conf",
    "max-restarts",
    "master-addr",
    "master-port",
    "monitor-interval",
)
# Set in the workers of our launcher: it has already checked the run (on one node it also holds the lock), and collects
# their errors.
LAUNCHED_ENV = "DISTRINEWS_LAUNCHED"


class LaunchError(ValueError):
    """A launcher flag is malformed."""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports (all held open while choosing, so none is picked twice)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def split_launch_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Take the torchrun flags out of ``argv``: ``({"nproc-per-node": "2", ...}, the rest)``."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        name = token[2:].split("=", 1)[0].replace("_", "-") if token.startswith("--") else ""
        if name not in LAUNCH_FLAGS:
            rest.append(token)
        elif "=" in token:
            flags[name] = token.split("=", 1)[1]
        elif (value := next(tokens, None)) is not None:
            flags[name] = value
        else:
            raise LaunchError(f"--{name} needs a value")
    _check(flags)
    return flags, rest


def _check(flags: dict[str, str]) -> None:
    for name in ("node-rank", "max-restarts", "master-port", "monitor-interval"):
        if name in flags and not flags[name].lstrip("-").isdigit():
            raise LaunchError(f"--{name} expects an integer, got {flags[name]!r}")
    nproc = flags.get("nproc-per-node")
    if nproc is not None and not (nproc in ("auto", "cpu", "gpu", "xpu") or (nproc.isdigit() and int(nproc) >= 1)):
        raise LaunchError(f"--nproc-per-node expects a number >= 1 (or auto, cpu, gpu), got {nproc!r}")
    nnodes = flags.get("nnodes")
    if nnodes is not None and not all(part.isdigit() and int(part) >= 1 for part in nnodes.split(":", 1)):
        raise LaunchError(f"--nnodes expects N or MIN:MAX, got {nnodes!r}")


def wants_launch(flags: dict[str, str]) -> bool:
    """Start workers when launcher flags were given (or torchrun's PET_* layout is set), unless we are one."""
    if under_torchrun():
        return False
    return bool(flags) or any(os.environ.get(f"PET_{v}") for v in ("NPROC_PER_NODE", "NNODES"))


def spans_nodes(flags: dict[str, str]) -> bool:
    """Whether the run may take more than this node (``--nnodes 2``, ``1:4``, or torchrun's ``PET_NNODES``)."""
    raw = flags.get("nnodes") or os.environ.get("PET_NNODES") or "1"
    return max((int(part) for part in raw.split(":") if part.isdigit()), default=1) > 1


def nproc_per_node(flags: dict[str, str]) -> int | None:
    raw = flags.get("nproc-per-node") or os.environ.get("PET_NPROC_PER_NODE")
    return int(raw) if raw and raw.isdigit() else None


def torchrun_args(flags: dict[str, str], argv: list[str]) -> argparse.Namespace:
    """torchrun's own parsed arguments for ``python -m distrinews <argv>`` on this node."""
    from torch.distributed.run import get_args_parser

    cli = [word for name, value in flags.items() for word in (f"--{name}", value)]
    endpoint = flags.get("rdzv-endpoint") or os.environ.get("PET_RDZV_ENDPOINT")
    if endpoint and "rdzv-backend" not in flags and not os.environ.get("PET_RDZV_BACKEND"):
        # Dynamic rendezvous at the given endpoint: nodes may start in any order, and restart. Without an
        # endpoint torchrun's static rendezvous at MASTER_ADDR:MASTER_PORT stays (what the Kubeflow
        # operators set through PET_MASTER_ADDR/PORT); c10d there would fall back to each node's localhost.
        cli += ["--rdzv-backend", "c10d"]
    conf = flags.get("rdzv-conf") or os.environ.get("PET_RDZV_CONF") or ""
    if endpoint and "is_host" not in conf and _is_this_machine(endpoint.rpartition(":")[0] or endpoint):
        # torch decides who hosts the rendezvous store by host name; a node addressed by an IP of
        # one of its interfaces (a second network, a container, a namespace) would wait for itself.
        conf = ",".join(filter(None, [conf, "is_host=true"]))
        cli = [c for c in cli if c != flags.get("rdzv-conf")]
        cli = [c for c in cli if c != "--rdzv-conf"] + ["--rdzv-conf", conf]
    # The agent would turn SIGTERM into killing the workers; ``launch`` forwards it to them instead.
    cli += ["--signals-to-handle", "SIGINT,SIGHUP,SIGQUIT"]
    return get_args_parser().parse_args([*cli, "--module", "distrinews", *argv])


def _is_this_machine(host: str) -> bool:
    """Whether ``host`` is a non-loopback address of this machine: only local addresses can be bound."""
    import ipaddress

    try:
        address = str(socket.getaddrinfo(host, None)[0][4][0])  # an IP address for AF_INET and AF_INET6
        if ipaddress.ip_address(address).is_loopback:
            return False  # torch itself treats loopback as local, and lets a second node fall back to a client
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except (OSError, ValueError, IndexError):
        return False


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """``python -m torch.distributed.run`` for ``nproc`` workers of ``python -m distrinews <argv>`` on this node,
    on a free port: what the benchmarks start as a child process for each measured point."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*torchrun, "-m", "distrinews", *argv]


def launch(flags: dict[str, str], argv: list[str]) -> int:
    """Run ``distrinews <argv>`` as torchrun's workers on this node; the run's exit code. SIGTERM (a preemption,
    ``scancel``) is passed on to the workers, which save a checkpoint at the next step and exit 0 (``--resume auto``
    continues the run); workers still running ``PREEMPTION_GRACE_S`` seconds later are killed."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
    from torch.distributed.run import run

    from .machine import threads_per_process

    args = torchrun_args(flags, argv)
    rollcall = _rollcall(args, flags)
    nproc = nproc_per_node(flags)
    if nproc:  # torchrun would give every process one thread (and say so); give each its share of the cores
        os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process(nproc)))
    os.environ[LAUNCHED_ENV] = "1"
    previous = signal.signal(signal.SIGTERM, _forward_to_workers)
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    if args.max_restarts == 0:  # with restarts, the agent's line is all that shows a worker failed and was restarted
        agent_log.addFilter(_restated_by_us)
    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        return report_failures(exc.failures)
    except RendezvousTimeoutError:
        reason = rollcall.explain_timeout() if rollcall else "the rendezvous timed out before every node joined"
        print(one_line(reason), file=sys.stderr)
        return 1
    except SignalException as exc:  # the agent has already stopped the workers
        print(f"distrinews: stopped by {exc.sigval.name}", file=sys.stderr)
        return 128 + int(exc.sigval)
    finally:
        agent_log.removeFilter(_restated_by_us)
        signal.signal(signal.SIGTERM, previous)


def _restated_by_us(record: logging.LogRecord) -> bool:
    """Drop the agent's lines on a failed worker ("failed (exitcode: 2) local_rank: 0 ...", "Sending
    process N closing signal SIGTERM"): ``report_failures`` says the same, once, in one line."""
    return not str(record.msg).startswith(("failed (exitcode", "Sending process"))


def _rollcall(args: argparse.Namespace, flags: dict[str, str]) -> RollCall | None:
    """Sign this node in beside a multi-node dynamic rendezvous (see ``rollcall``); None otherwise."""
    from torch.distributed.run import parse_min_max_nnodes

    from .rollcall import RollCall

    _, nnodes = parse_min_max_nnodes(args.nnodes)
    if args.rdzv_backend != "c10d" or nnodes < 2 or not args.rdzv_endpoint:
        return None
    given = flags.get("node-rank") or os.environ.get("PET_NODE_RANK")
    conf = dict(item.split("=", 1) for item in (args.rdzv_conf or "").split(",") if "=" in item)
    timeout = float(conf.get("join_timeout", 600))
    return RollCall(args.rdzv_endpoint, args.rdzv_id, int(given) if given else None, nnodes, timeout).start()


PREEMPTION_GRACE_S = float(os.environ.get("DISTRINEWS_PREEMPTION_GRACE_S", "120"))


def _forward_to_workers(signum: int, _frame: Any) -> None:
    name = signal.Signals(signum).name
    print(f"distrinews: {name}: the workers save a checkpoint at the next step boundary, then stop", file=sys.stderr)
    _signal_workers(signum)
    timer = threading.Timer(PREEMPTION_GRACE_S, _signal_workers, args=(signal.SIGKILL,))  # the stragglers
    timer.daemon = True
    timer.start()


def _signal_workers(signum: int) -> None:
    for pid in child_pids(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (Linux ``/proc``): the workers the agent started."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name (2nd field) may hold spaces; the parent pid is the 2nd field after it
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(stat.parent.name))
    return children


def _is_ours(message: Any) -> bool:
    return isinstance(message, str) and message.startswith(PREFIX)


def report_failures(failures: dict[int, Any]) -> int:
    """Say why the run failed in as few lines as it takes: a usage error (``record_worker_error``) once however
    many ranks hit it, and exit 2 when every worker that failed by itself stopped on one; else the first worker to
    fail is named (the launcher stopped the others because of it)."""
    usage = [f.timestamp for f in failures.values() if f.exitcode == 2 and _is_ours(f.message)]
    # Taken down with the run, not causes: ranks the launcher stopped (SIGTERM), and ranks killed by a signal no
    # earlier than a usage error (an abort while their process group was torn down under them, seen under load).
    taken_down = {
        r
        for r, f in failures.items()
        if f.exitcode == -int(signal.SIGTERM)
        or (f.exitcode < 0 and usage and f.timestamp >= min(usage))
        # an abort in teardown is stamped when it is seen, which can be the second before the usage error's own
        or (f.exitcode == -int(signal.SIGABRT) and usage and f.timestamp >= min(usage) - 1)
    }
    causes = {r: f for r, f in failures.items() if r not in taken_down} or failures
    messages = {f.message for f in causes.values() if _is_ours(f.message)}
    if messages and all(f.exitcode == 2 for f in causes.values()):
        for message in sorted(messages):
            print(message, file=sys.stderr)
        return 2
    rank, first = min(causes.items(), key=lambda item: (item[1].timestamp, item[0]))
    if _is_ours(first.message):
        print(first.message, file=sys.stderr)
    else:
        how = (
            f"was killed by {first.signal_name()}"
            if first.exitcode < 0
            else f"failed with exit code {first.exitcode} (its output is above)"
        )
        others = "; the other workers were stopped" if len(failures) > 1 else ""
        print(f"{PREFIX}worker rank {rank} {how}{others}", file=sys.stderr)
    return 1


def record_worker_error(message: str) -> bool:
    """In a worker of our launcher: hand ``message`` to the launcher (it prints each distinct one once); False
    when there is no launcher to tell (plain torchrun, or one process): print it then."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not (path and os.environ.get(LAUNCHED_ENV)):
        return False
    if os.path.exists(path):  # handed over already, before the process group was torn down: that time stands
        return True
    with open(path, "w") as fh:
        json.dump({"message": message, "timestamp": int(time.time())}, fh)
    return True

"""``distrinews serve-replicas``: N servers behind nginx on one port (the supervisor is ``serve/replicas.py``).

Flags of ``distrinews serve`` that are not serve-replicas' own (``--runtime``, ``--max-batch-size`` ...) are
passed to every replica. ``make serve-replicas REPLICAS=2 PORT=8080 CHECKPOINT=runs/cpu-quick/best`` runs it.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..serve.children import MAX_LOG_BYTES, TAIL_BYTES
from ..serve.nginx import CLIENT_CONNECTIONS, CLIENT_RATE

if TYPE_CHECKING:
    from . import Subparsers


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "serve-replicas",
        help="N `distrinews serve` replicas behind nginx on one "
        "port (health-checked, retried, rolling restarts on SIGHUP)",
        description="Starts N `distrinews serve` processes on loopback ports and nginx in front of them on "
        "--port. Other flags of `distrinews serve` (--runtime, --max-batch-size ...) go to every replica. "
        "SIGHUP restarts the replicas one at a time on the checkpoint --checkpoint names then (point a "
        "symlink at a new best/ to roll out a model); SIGTERM or Ctrl-C stops everything, and so does SIGKILL.",
    )
    p.add_argument(
        "--checkpoint", default=None, help="best/ directory (or a symlink to one; default: $MODEL_CHECKPOINT)"
    )
    p.add_argument("--replicas", type=int, default=2, help="server processes (default: 2)")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="nginx's port (default: $PORT, else 8080; 0: a free one, named in the ready line)",
    )
    p.add_argument("--host", default="127.0.0.1", help="nginx's interface (the replicas listen on 127.0.0.1 only)")
    p.add_argument("--threads", type=int, default=0, help="threads per replica (default: the cores / replicas)")
    _front_limits(p)
    _children(p)
    p.set_defaults(func=cmd_serve_replicas)


def _front_limits(p: argparse.ArgumentParser) -> None:
    """What nginx allows each client: header and rest timeouts, connections and rate per address."""
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send its request headers (nginx, replicas)",
    )
    p.add_argument(
        "--fail-timeout",
        type=float,
        default=2.0,
        help="seconds nginx rests a replica that failed a request (fail_timeout)",
    )
    p.add_argument(
        "--client-connections",
        type=int,
        default=CLIENT_CONNECTIONS,
        help="requests one client address may have in progress at once at nginx; more are answered 429 (default: "
        f"{CLIENT_CONNECTIONS}; 0: no limit, for a front that sees one address for all, such as another proxy)",
    )
    p.add_argument(
        "--client-rate",
        type=int,
        default=CLIENT_RATE,
        help="requests a second one client address may send at nginx, a second's worth at once; more are answered "
        f"429 (default: {CLIENT_RATE}; 0: no limit)",
    )


def _children(p: argparse.ArgumentParser) -> None:
    """How the replicas and nginx start, where they log, and the pid file."""
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds a replica may take to load its model")
    p.add_argument("--nginx", default=None, help="the nginx binary (default: nginx on PATH, else /usr/sbin/nginx)")
    p.add_argument(
        "--log-dir",
        default=None,
        help="keep the replicas' and nginx's logs here (default: a temp dir, removed at exit)",
    )
    p.add_argument(
        "--max-log-bytes",
        type=int,
        default=MAX_LOG_BYTES,
        help="each log (a replica's, nginx's access and error logs) is kept under this many bytes, with one previous "
        f"part as LOG.1 (default: {MAX_LOG_BYTES >> 20} MiB)",
    )
    p.add_argument("--pid-file", default=None, help="write this process's pid here (for `kill -HUP $(cat FILE)`)")


def cmd_serve_replicas(args: argparse.Namespace, extra: list[str]) -> int:
    from . import require_serving

    require_serving("serve-replicas")
    from ..checkpoint.servable import check_loadable
    from ..distributed.machine import threads_per_process
    from ..serve.nginx import find_nginx
    from ..serve.options import ServeOptionError
    from ..serve.replicas import ReplicaSettings, parse_serve_args, run_replicas

    checkpoint = args.checkpoint or os.environ.get("MODEL_CHECKPOINT")
    if not checkpoint:
        raise ServeOptionError(
            "serve-replicas needs a checkpoint: --checkpoint runs/NAME/best (or set MODEL_CHECKPOINT)"
        )
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    port = args.port if args.port is not None else int(os.environ.get("PORT") or 8080)
    if not 0 <= port <= 65535:
        raise ServeOptionError(f"--port must be 0..65535, got {port}")
    if args.replicas < 1:
        raise ServeOptionError(f"--replicas must be >= 1, got {args.replicas}")
    for name in ("threads", "client_connections", "client_rate"):
        if getattr(args, name) < 0:
            raise ServeOptionError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.header_timeout <= 0 or args.fail_timeout <= 0:
        raise ServeOptionError("--header-timeout and --fail-timeout must be > 0")
    if args.max_log_bytes < TAIL_BYTES:  # the end of a log that is read back fits in it
        raise ServeOptionError(f"--max-log-bytes must be at least {TAIL_BYTES}, got {args.max_log_bytes}")
    serve = parse_serve_args(extra)
    nginx = find_nginx(args.nginx)
    check_loadable(checkpoint)  # a refused or damaged checkpoint: one line, before anything starts
    settings = ReplicaSettings(
        checkpoint=checkpoint,
        replicas=args.replicas,
        port=port,
        host=args.host,
        threads=args.threads or threads_per_process(args.replicas),
        header_timeout=args.header_timeout,
        fail_timeout=args.fail_timeout,
        max_body_bytes=serve.max_body_bytes,
        client_connections=args.client_connections,
        client_rate=args.client_rate,
        ready_timeout=args.ready_timeout,
        read_timeout=max(60.0, serve.timeout_graceful_shutdown),
        nginx=nginx,
        log_dir=args.log_dir,
        max_log_bytes=args.max_log_bytes,
        pid_file=args.pid_file,
        serve_args=extra,
    )
    return run_replicas(settings)

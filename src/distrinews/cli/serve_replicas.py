"""``distrinews serve-replicas``: N servers behind nginx on one port (the supervisor is ``serve/replicas.py``).

Flags of ``distrinews serve`` that are not serve-replicas' own (``--runtime``, ``--max-batch-size`` ...) are
passed to every replica. ``make serve-replicas REPLICAS=2 PORT=8080 CHECKPOINT=runs/cpu-quick/best`` runs it.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..distributed.lifetime import TAIL_BYTES
from ..options import Option, add_options, check_options, fill_from_env
from ..serve.children import MAX_LOG_BYTES
from ..serve.nginx import CLIENT_CONNECTIONS, CLIENT_RATE
from .common import require_extra

if TYPE_CHECKING:
    from .common import Subparsers


OPTIONS = [
    Option(
        "checkpoint", help="best/ directory (or a symlink to one; default: $MODEL_CHECKPOINT)", env="MODEL_CHECKPOINT"
    ),
    Option("replicas", 2, "server processes (default: 2)", minimum=1),
    Option(
        "port",
        help="nginx's port (default: $PORT, else 8080; 0: a free one, named in the ready line)",
        type=int,
        minimum=0,
        maximum=65535,
        env="PORT",
    ),
    Option("host", "127.0.0.1", "nginx's interface (the replicas listen on 127.0.0.1 only)"),
    Option("threads", 0, "threads per replica (default: the cores / replicas)", minimum=0),
    # What nginx allows each client: header and rest timeouts, connections and rate per address.
    Option("header_timeout", 10.0, "seconds a client has to send its request headers (nginx, replicas)", above=0),
    Option("fail_timeout", 2.0, "seconds nginx rests a replica that failed a request (fail_timeout)", above=0),
    Option(
        "client_connections",
        CLIENT_CONNECTIONS,
        "requests one client address may have in progress at once at nginx; more are answered 429 (default: "
        f"{CLIENT_CONNECTIONS}; 0: no limit, for a front that sees one address for all, such as another proxy)",
        minimum=0,
    ),
    Option(
        "client_rate",
        CLIENT_RATE,
        "requests a second one client address may send at nginx, a second's worth at once; more are answered "
        f"429 (default: {CLIENT_RATE}; 0: no limit)",
        minimum=0,
    ),
    # How the replicas and nginx start, where they log, and the pid file.
    Option("ready_timeout", 300.0, "seconds a replica may take to load its model"),
    Option("nginx", help="the nginx binary (default: nginx on PATH, else /usr/sbin/nginx)"),
    Option("log_dir", help="keep the replicas' and nginx's logs here (default: a temp dir, removed at exit)"),
    Option(
        "max_log_bytes",
        MAX_LOG_BYTES,
        "each log (a replica's, nginx's access and error logs) is kept under this many bytes, with one previous "
        f"part as LOG.1 (default: {MAX_LOG_BYTES >> 20} MiB)",
        minimum=TAIL_BYTES,  # the end of a log that is read back fits in it
    ),
    Option("pid_file", help="write this process's pid here (for `kill -HUP $(cat FILE)`)"),
]


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
    add_options(p, OPTIONS)
    p.set_defaults(func=cmd_serve_replicas)


def cmd_serve_replicas(args: argparse.Namespace, extra: list[str]) -> int:
    require_extra("serve", "serve-replicas")
    from ..checkpoint.servable import check_loadable
    from ..distributed.machine import threads_per_process
    from ..serve.nginx import find_nginx
    from ..serve.options import ServeOptionError
    from ..serve.replicas import ReplicaSettings, Supervisor, parse_serve_args

    fill_from_env(args, OPTIONS, ServeOptionError)
    checkpoint = args.checkpoint
    if not checkpoint:
        raise ServeOptionError(
            "serve-replicas needs a checkpoint: --checkpoint runs/NAME/best (or set MODEL_CHECKPOINT)"
        )
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    args.port = 8080 if args.port is None else args.port
    check_options(args, OPTIONS, ServeOptionError)
    serve = parse_serve_args(extra)
    nginx = find_nginx(args.nginx)
    check_loadable(checkpoint)  # a refused or damaged checkpoint: one line, before anything starts
    # the options that are a setting as they are; --checkpoint, --threads and --nginx are resolved first
    given = {o.name: getattr(args, o.name) for o in OPTIONS if o.name not in ("checkpoint", "threads", "nginx")}
    settings = ReplicaSettings(
        checkpoint=checkpoint,
        threads=args.threads or threads_per_process(args.replicas),
        max_body_bytes=serve.max_body_bytes,
        read_timeout=max(60.0, serve.timeout_graceful_shutdown),
        nginx=nginx,
        serve_args=extra,
        **given,
    )
    return Supervisor(settings).run()

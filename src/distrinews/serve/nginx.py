"""nginx in front of ``serve-replicas``: the binary, and its configuration from ``deploy/nginx/nginx.conf.template``
filled in with the replicas' ports, the limits and the paths of this run."""

from __future__ import annotations

import os
import resource
import shutil
from pathlib import Path

from .options import ServeOptionError
from .routes import RETRIED_POST_PATHS

NGINX_TEMPLATE = "nginx.conf.template"
# Per client address (serve-replicas' --client-connections and --client-rate; 0: no limit): requests in progress at
# once, and requests a second with a second's worth at once. Far above what one client of a model server needs (two
# cores answer about 250 requests a second in all), far below what a thousand sockets of one host hold.
CLIENT_CONNECTIONS = 64
CLIENT_RATE = 500
# The addresses nginx keeps a count for, per limit: 16,000 a megabyte (nginx's figure); past that a new one gets a 429.
CLIENT_ZONE = "10m"
# Connections nginx holds at once, the clients' and the replicas' together (worker_connections). Each takes a file
# descriptor, and so may each request body buffered to a temp file: two files per connection, plus its logs.
MAX_CONNECTIONS = 4096
SPARE_FILES = 64
MIN_CONNECTIONS = 256
INSTALL_HINT = (
    "`apt-get install nginx-light` installs it (`make serve-replicas` does that where it may), or pass --nginx PATH"
)


def template_path() -> Path:
    """deploy/nginx/nginx.conf.template of the checkout this package runs from."""
    path = Path(__file__).resolve().parents[3] / "deploy" / "nginx" / NGINX_TEMPLATE
    if not path.is_file():
        raise FileNotFoundError(
            f"the nginx template {path} is missing (serve-replicas runs from a checkout: pip install -e .)"
        )
    return path


def find_nginx(given: str | None = None) -> str:
    """The nginx binary: ``given``, else on PATH, else Debian's /usr/sbin/nginx (not on a normal user's PATH)."""
    if given:
        if not (Path(given).is_file() and os.access(given, os.X_OK)):
            raise ServeOptionError(f"--nginx {given} is not an executable file")
        return given
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if not found:
        raise ServeOptionError(f"serve-replicas needs nginx, which is not installed here: {INSTALL_HINT}")
    return found


def connection_budget() -> tuple[int, int]:
    """(worker_connections, open files to give nginx): ``MAX_CONNECTIONS`` and their files, or what the hard limit
    allows. With ``master_process off`` nginx ignores worker_rlimit_nofile: ``start_child`` sets the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = 2 * MAX_CONNECTIONS + SPARE_FILES
    if hard != resource.RLIM_INFINITY:
        files = min(files, hard)
    connections = min(MAX_CONNECTIONS, (files - SPARE_FILES) // 2)
    if connections < MIN_CONNECTIONS:
        raise ServeOptionError(
            f"nginx needs at least {2 * MIN_CONNECTIONS + SPARE_FILES} open files; the hard limit here is {hard} "
            "(raise it: ulimit -Hn, LimitNOFILE=, docker run --ulimit nofile=...)"
        )
    keep = soft == resource.RLIM_INFINITY or soft >= files  # never lowered
    return connections, soft if keep else files


def client_limits(connections: int, rate: int) -> dict[str, str]:
    """The template's per-client limits: the zones (http level), the limits (server level) and the 429's words."""
    zones, limits, said = [], [], []
    if connections:
        zones.append(f"    limit_conn_zone $binary_remote_addr zone=client_connections:{CLIENT_ZONE};")
        limits += [f"        limit_conn client_connections {connections};", "        limit_conn_status 429;"]
        limits.append("        limit_conn_log_level info;")  # below the error log's level: the access log has them
        said.append(f"{connections} requests at once")
    if rate:
        zones.append(f"    limit_req_zone $binary_remote_addr zone=client_rate:{CLIENT_ZONE} rate={rate}r/s;")
        limits += [f"        limit_req zone=client_rate burst={rate} nodelay;", "        limit_req_status 429;"]
        limits.append("        limit_req_log_level info;")
        said.append(f"{rate} requests a second")
    limit = f": at most {' and '.join(said)} (--client-connections, --client-rate)" if said else ""
    return {
        "CLIENT_LIMIT_ZONES": "\n".join(zones),
        "CLIENT_LIMITS": "\n".join(limits),
        "TOO_MANY": f"too many requests from this address{limit}; retry shortly",
    }


def retried_locations(tries: int, read_timeout: float) -> str:
    """A location per POST route of the app (``routes.RETRIED_POST_PATHS``) whose failure on one replica (refused,
    reset, 502, 503, a timeout) nginx passes to the next, POST included (non_idempotent)."""
    block = (
        "        location = {path} {{\n"
        "            proxy_pass http://replicas;\n"
        "            proxy_next_upstream error timeout http_502 http_503 non_idempotent;\n"
        f"            proxy_next_upstream_tries {tries};\n"
        f"            proxy_next_upstream_timeout {read_timeout:g}s;\n"
        "        }}"
    )
    return "\n\n".join(block.format(path=path) for path in RETRIED_POST_PATHS)


def nginx_conf(
    *,
    temp: Path,
    log_dir: Path,
    listen: str,
    replica_ports: list[int],
    fail_timeout: float,
    header_timeout: float,
    read_timeout: float,
    max_body_bytes: int,
    worker_connections: int = MAX_CONNECTIONS,
    client_connections: int = CLIENT_CONNECTIONS,
    client_rate: int = CLIENT_RATE,
) -> str:
    """The template with this run's values: ``temp`` for nginx's pid and temp files, ``listen`` is host:port."""
    servers = "\n".join(
        f"        server 127.0.0.1:{port} max_fails=1 fail_timeout={fail_timeout:g}s;" for port in replica_ports
    )
    values = {
        "TEMP": str(temp),
        "ACCESS_LOG": str(log_dir / "nginx-access.log"),
        "WORKER_CONNECTIONS": str(worker_connections),
        "HEADER_TIMEOUT": f"{header_timeout:g}",
        "READ_TIMEOUT": f"{read_timeout:g}",
        "CLIENT_MAX_BODY": str(max_body_bytes + 64 * 1024),
        "MAX_BODY_BYTES": f"{max_body_bytes:,}",
        "SERVERS": servers,
        "LISTEN": listen,
        "TRIES": str(len(replica_ports)),
        "UPSTREAM_KEEPALIVE_MS": str(int(1000 * min(header_timeout, 5.0) / 2)),
        "RETRIED_LOCATIONS": retried_locations(len(replica_ports), read_timeout),
        **client_limits(client_connections, client_rate),
    }
    text = template_path().read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text

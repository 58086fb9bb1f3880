"""nginx in front of ``serve-replicas``: the binary, and its configuration from ``deploy/nginx/nginx.conf.template``
filled in with the replicas' ports, the limits and the paths of this run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .options import ServeOptionError

NGINX_TEMPLATE = "nginx.conf.template"
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
) -> str:
    """The template with this run's values: ``temp`` for nginx's pid and temp files, the access log in ``log_dir``,
    ``listen`` (host:port), an upstream server per replica port."""
    servers = "\n".join(
        f"        server 127.0.0.1:{port} max_fails=1 fail_timeout={fail_timeout:g}s;" for port in replica_ports
    )
    values = {
        "TEMP": str(temp),
        "ACCESS_LOG": str(log_dir / "nginx-access.log"),
        "WORKER_CONNECTIONS": "4096",
        "HEADER_TIMEOUT": f"{header_timeout:g}",
        "READ_TIMEOUT": f"{read_timeout:g}",
        "CLIENT_MAX_BODY": str(max_body_bytes + 64 * 1024),
        "MAX_BODY_BYTES": f"{max_body_bytes:,}",
        "SERVERS": servers,
        "LISTEN": listen,
        "TRIES": str(len(replica_ports)),
        "UPSTREAM_KEEPALIVE_MS": str(int(1000 * min(header_timeout, 5.0) / 2)),
    }
    text = template_path().read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text

"""nginx's configuration for ``serve-replicas`` (``serve/nginx.py``), read as text: every POST route of the app is
resent to the next replica when one fails it, the per-client limits are the options', and nginx gets the open files
its connections need. nginx itself runs these in tests/integration/test_nginx_front.py."""

from __future__ import annotations

import re
import resource
from pathlib import Path

import pytest

from distrinews.serve import nginx
from distrinews.serve.app import create_app
from distrinews.serve.options import ServeConfig, ServeOptionError
from distrinews.serve.routes import RETRIED_POST_PATHS


def conf(tmp_path: Path, **limits: int) -> str:
    timeouts = {"fail_timeout": 2, "header_timeout": 10, "read_timeout": 60}
    return nginx.nginx_conf(temp=tmp_path, log_dir=tmp_path, listen="127.0.0.1:8080", replica_ports=[9001, 9002],
                            max_body_bytes=1 << 20, **timeouts, **limits)  # fmt: skip


def retried(text: str) -> set[str]:
    """The paths of the exact locations that resend a POST to the next replica."""
    blocks = re.findall(r"^\s*location = (\S+) \{(.*?)\}", text, flags=re.M | re.S)
    return {path for path, body in blocks if re.search(r"proxy_next_upstream [^;]*\bnon_idempotent;", body)}


def app_post_paths(fake_predictor) -> set[str]:
    app = create_app(ServeConfig(checkpoint="unused", api_key=""), predictor_factory=fake_predictor)
    return {route.path for route in app.routes if "POST" in getattr(route, "methods", ())}


def test_every_post_route_of_the_app_is_resent_by_nginx(tmp_path, fake_predictor):
    """A POST route added to the app fails here until it is declared in serve/routes.py (a pure function of its
    body, resent) or nginx is taught otherwise: it must never fall silently into ``location /``."""
    posts = app_post_paths(fake_predictor)
    assert {"/predict", "/predict/batch", "/", "/invocations"} <= posts
    assert posts == set(RETRIED_POST_PATHS), "a POST route of the app that nginx does not resend, or one it lacks"
    assert retried(conf(tmp_path)) == posts


def test_the_check_sees_a_route_left_to_location_slash(tmp_path, fake_predictor):
    text = conf(tmp_path)
    lost = re.sub(r"location = /invocations \{.*?\}", "", text, flags=re.S)
    assert retried(lost) == app_post_paths(fake_predictor) - {"/invocations"}
    # the template before the fix: only /predict and /predict/batch had locations that resend
    assert retried(text.replace("location = / {", "location = /unused {")) != app_post_paths(fake_predictor)


def test_client_limits_are_the_options(tmp_path):
    text = conf(tmp_path, client_connections=8, client_rate=20)
    assert "limit_conn_zone $binary_remote_addr zone=client_connections:10m;" in text
    assert "limit_req_zone $binary_remote_addr zone=client_rate:10m rate=20r/s;" in text
    assert "limit_conn client_connections 8;" in text and "limit_req zone=client_rate burst=20 nodelay;" in text
    assert "limit_conn_status 429;" in text and "limit_req_status 429;" in text
    assert "at most 8 requests at once and 20 requests a second" in text
    none = conf(tmp_path, client_connections=0, client_rate=0)
    directives = [line.strip() for line in none.splitlines() if not line.strip().startswith("#")]
    assert not [d for d in directives if d.startswith(("limit_conn", "limit_req")) or "{{" in d]
    assert "limit_conn client_connections 64;" in conf(tmp_path) and "rate=500r/s" in conf(tmp_path)  # the defaults


def test_slow_clients_are_cut_per_read_and_per_write(tmp_path):
    text = conf(tmp_path)
    for directive in ("client_header_timeout 10s;", "client_body_timeout 10s;", "send_timeout 10s;"):
        assert directive in text
    assert "reset_timedout_connection on;" in text and "worker_connections 4096;" in text


@pytest.mark.parametrize(
    ("soft", "hard", "expected"),
    [
        (1024, 1 << 20, (4096, 2 * 4096 + 64)),  # a shell's usual soft limit: raised for nginx
        (65536, 1 << 20, (4096, 65536)),  # never lowered
        (1024, 4096, (2016, 4096)),  # a low hard limit: fewer connections, as many as it allows
        (1024, resource.RLIM_INFINITY, (4096, 2 * 4096 + 64)),
    ],
)
def test_connection_budget_fits_the_open_files(monkeypatch, soft, hard, expected):
    monkeypatch.setattr(nginx.resource, "getrlimit", lambda which: (soft, hard))
    assert nginx.connection_budget() == expected


def test_connection_budget_refuses_a_hard_limit_too_low_to_serve(monkeypatch):
    monkeypatch.setattr(nginx.resource, "getrlimit", lambda which: (256, 256))
    with pytest.raises(ServeOptionError, match=r"open files; the hard limit here is 256 \(raise it"):
        nginx.connection_budget()


@pytest.mark.parametrize("flag", ["--client-connections", "--client-rate"])
def test_negative_client_limits_are_refused(tmp_path, capsys, flag):
    from distrinews.cli import main

    assert main(["serve-replicas", "--checkpoint", str(tmp_path), flag, "-1"]) == 2
    assert f"{flag} must be >= 0 (0: no limit), got -1" in capsys.readouterr().err

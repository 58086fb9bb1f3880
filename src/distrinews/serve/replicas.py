"""``distrinews serve-replicas``: N ``distrinews serve`` processes on loopback ports, nginx in front on one port.

The supervisor (this process) owns every process it starts:

- each replica and nginx is its child, in a process group of its own (a terminal's Ctrl-C reaches only the
  supervisor, which stops them in order), and dies with it even on SIGKILL (``distributed.lifetime``);
- nginx (``deploy/nginx/nginx.conf.template``, filled in a temp directory, in the foreground) starts only once
  every replica answers ``/ready``; a replica that exits by itself is started again, with a back-off while it keeps
  failing (nginx routes around it);
- SIGHUP rolls the replicas one at a time onto the checkpoint ``--checkpoint`` resolves to now (a symlink pointed at
  a new ``best/`` rolls out a new model): SIGTERM (it drains), a new one on the same port, wait for ``/ready``.
  Before each goes, every other one has been ready for ``fail_timeout`` + 1 s, so nginx routes to it again; a new
  replica that never gets ready is started again on its old checkpoint, and the roll stops;
- SIGTERM or SIGINT stops nginx gracefully (SIGQUIT), then drains the replicas (SIGTERM), and exits 0;
- every log its children write is kept under ``--max-log-bytes`` with one previous part (``LOG.1``), and only a
  log's end is ever read back (``children``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from ..checkpoint.atomic import write_text_atomically
from ..distributed.launch import free_ports
from ..distributed.lifetime import log_tail, stop_processes
from .children import MAX_LOG_BYTES, address_taken, bound_log, get_json, start_child
from .nginx import CLIENT_CONNECTIONS, CLIENT_RATE, connection_budget, nginx_conf
from .options import ServeOptionError


@dataclass
class ReplicaSettings:
    """What ``serve-replicas`` was asked for (flags of ``cli/serve_replicas.py``)."""

    checkpoint: str
    replicas: int = 2
    port: int = 8080
    host: str = "127.0.0.1"
    threads: int = 1
    header_timeout: float = 10.0
    fail_timeout: float = 2.0
    max_body_bytes: int = 4 * 1024 * 1024
    ready_timeout: float = 300.0
    read_timeout: float = 60.0
    client_connections: int = CLIENT_CONNECTIONS  # per client address, at nginx (0: no limit)
    client_rate: int = CLIENT_RATE  # requests a second per client address, at nginx (0: no limit)
    nginx: str = "nginx"
    log_dir: str | None = None
    max_log_bytes: int = MAX_LOG_BYTES
    pid_file: str | None = None
    serve_args: list[str] = field(default_factory=list)  # more `distrinews serve` flags, for every replica


# How many ports a process that found its port taken tries in all (the port is picked free, then bound by a
# process that starts later: another process may take it in between)
BIND_TRIES = 5


class Replica:
    """One ``distrinews serve`` on a loopback port; started again on the same port when it restarts."""

    def __init__(self, index: int, port: int, settings: ReplicaSettings, log_dir: Path):
        self.index, self.port, self.settings = index, port, settings
        self.log_path = log_dir / f"replica-{index}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.checkpoint: str | None = None
        self.started_at = 0.0
        self.ready_since: float | None = None  # when the supervisor first saw this process answer /ready
        self.failures = 0  # exits in a row before getting ready; sets the back-off
        self.log_offset = 0  # where this process's output starts in the log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, checkpoint: str) -> None:
        s = self.settings
        cmd = [sys.executable, "-m", "distrinews", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--threads", str(s.threads), "--header-timeout", str(s.header_timeout)]
        cmd += s.serve_args
        env = {**os.environ, "OMP_NUM_THREADS": str(s.threads)}
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc, self.checkpoint, self.started_at = start_child(cmd, self.log_path, env), checkpoint, time.monotonic()
        self.ready_since = None

    def seen_ready(self) -> bool:
        """Whether it answers /ready (once it has, it counts as ready until it is started again or exits)."""
        if self.ready_since is None and self.ready():
            self.ready_since = time.monotonic()
        return self.ready_since is not None and self.alive()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        return self.alive() and get_json(self.url + "/ready")[0] == 200

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM: it stops listening at once, answers what it holds, exits."""
        stop_processes(self.proc, grace_s=timeout)


class Stopped(Exception):
    """SIGTERM or SIGINT arrived while waiting."""


class Supervisor:
    def __init__(self, settings: ReplicaSettings):
        self.settings = settings
        self.temp = Path(tempfile.mkdtemp(prefix="distrinews-replicas-"))
        self.log_dir = Path(settings.log_dir) if settings.log_dir else self.temp
        self.log_dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(settings.replicas)
        self.replicas = [Replica(i, port, settings, self.log_dir) for i, port in enumerate(ports)]
        self.nginx: subprocess.Popen[bytes] | None = None
        self.nginx_connections = 0  # worker_connections, once nginx runs
        self.stop_signal: int | None = None
        self.roll_requested = False
        self.port = settings.port  # nginx's; with --port 0, the one it got

    # ------------------------------------------------------------------ signals
    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        self.stop_signal = signum

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        self.roll_requested = True

    def _check_stop(self) -> None:
        if self.stop_signal is not None:
            raise Stopped

    def say(self, message: str) -> None:
        print(f"serve-replicas: {message}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        self.write_pid_file()
        handlers = {sig: signal.signal(sig, self._on_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        handlers[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hup)
        code = 0
        try:
            checkpoint = os.path.realpath(self.settings.checkpoint)
            for replica in self.replicas:
                replica.start(checkpoint)
            for replica in self.replicas:
                self._wait_ready(replica, first_start=True)
            self._start_nginx()
            versions = sorted({self._version(r) for r in self.replicas})
            s = self.settings
            self.say(
                f"ready on http://{s.host}:{self.port}: nginx in front of {s.replicas} replica(s) on ports "
                f"{', '.join(str(r.port) for r in self.replicas)}, {s.threads} thread(s) each, model version "
                f"{', '.join(versions)}; logs in {self.log_dir}; SIGHUP rolls them, Ctrl-C stops everything"
            )
            self.say(f"nginx: {self.nginx_connections} connections at most; per client address, {_limits(s)}")
            self._watch()
        except Stopped:
            assert self.stop_signal is not None, "Stopped is raised for a signal"
            self.say(f"{signal.Signals(self.stop_signal).name}: stopping nginx, then draining the replicas")
        except RuntimeError as exc:
            self.say(f"error: {exc}")
            code = 1
        finally:
            self._shutdown()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            if self.settings.pid_file:
                with contextlib.suppress(OSError):
                    Path(self.settings.pid_file).unlink()
            if code == 0 and not self.settings.log_dir:
                shutil.rmtree(self.temp, ignore_errors=True)
        return code

    def write_pid_file(self) -> None:
        """``--pid-file``, written whole and moved into place: never seen half written, never written through a link."""
        if not self.settings.pid_file:
            return
        try:
            write_text_atomically(Path(self.settings.pid_file), f"{os.getpid()}\n")
        except OSError as exc:  # a folder at its path, no such folder, no permission
            raise ServeOptionError(f"--pid-file {self.settings.pid_file}: cannot write it ({exc.strerror})") from None

    def _version(self, replica: Replica) -> str:
        status, body, _ = get_json(replica.url + "/info", timeout=10)
        return str(body.get("model_version")) if status == 200 else "unknown"

    def _other_port(self, host: str = "127.0.0.1") -> int:
        """A free port that no replica has (one still loading its model has not bound its own yet)."""
        taken = {r.port for r in self.replicas} | {self.port}
        while (port := free_ports(1, host)[0]) in taken:
            pass
        return port

    def _wait_ready(self, replica: Replica, first_start: bool = False) -> None:
        """Wait until ``replica`` answers /ready. On its ``first_start`` (nginx does not know its port yet) a
        replica whose port was taken meanwhile is started again on another."""
        deadline = time.monotonic() + self.settings.ready_timeout
        tries = 1
        while time.monotonic() < deadline:
            self._check_stop()
            taken = not replica.alive() and address_taken(replica.log_path, replica.log_offset)
            if first_start and tries < BIND_TRIES and taken:
                self.say(f"replica {replica.index}: port {replica.port} was taken; starting it on another")
                replica.port, tries = self._other_port(), tries + 1
                assert replica.checkpoint is not None, "started before it is waited on"
                replica.start(replica.checkpoint)
                continue
            if not replica.alive():
                assert replica.proc is not None, "started before it is waited on"
                raise RuntimeError(
                    f"replica {replica.index} (port {replica.port}) exited with {replica.proc.returncode} "
                    f"before it was ready; its log ({replica.log_path}) ends:\n{log_tail(replica.log_path)}"
                )
            if replica.seen_ready():
                replica.failures = 0
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"replica {replica.index} was not ready after {self.settings.ready_timeout:g}s; see {replica.log_path}"
        )

    @property
    def settle_seconds(self) -> float:
        """How long after a replica is ready nginx surely routes to it again: nginx rests a replica that failed a
        request for ``fail_timeout``, on a clock of whole seconds, so up to ``fail_timeout`` + 1 s after."""
        return self.settings.fail_timeout + 1.0 + 0.25

    def _wait_in_rotation(self, replicas: list[Replica]) -> None:
        """Wait until each of ``replicas`` has been ready for ``settle_seconds``: nginx routes to all of them."""
        deadline = time.monotonic() + self.settings.ready_timeout + self.settle_seconds
        for replica in replicas:
            # seen_ready() sets ready_since
            while not (replica.seen_ready() and time.monotonic() - (replica.ready_since or 0.0) >= self.settle_seconds):
                self._check_stop()
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"replica {replica.index} (port {replica.port}) is not ready; see {replica.log_path}"
                    )
                time.sleep(0.1)

    def _start_nginx(self) -> None:
        """nginx on ``--port``; with ``--port 0`` on a free port, and on another if that one was taken before nginx
        bound it (nginx cannot bind port 0 and tell which port it got)."""
        error_log = self.log_dir / "nginx-error.log" if self.settings.log_dir else self.temp / "nginx-error.log"
        for tries in range(1, BIND_TRIES + 1):
            if self.settings.port == 0:
                self.port = self._other_port(self.settings.host or "0.0.0.0")
            logs = {
                path: path.stat().st_size if path.exists() else 0 for path in (error_log, self.log_dir / "nginx.log")
            }
            try:
                return self._run_nginx(error_log)
            except RuntimeError:
                taken = any(address_taken(path, offset) for path, offset in logs.items())
                if self.settings.port != 0 or tries == BIND_TRIES or not taken:
                    raise
                self.say(f"nginx: port {self.port} was taken; trying another")

    def _run_nginx(self, error_log: Path) -> None:
        conf = self.temp / "nginx.conf"
        s = self.settings
        connections, open_files = connection_budget()
        conf.write_text(
            nginx_conf(
                temp=self.temp,
                log_dir=self.log_dir,
                listen=f"{s.host}:{self.port}",
                replica_ports=[r.port for r in self.replicas],
                fail_timeout=s.fail_timeout,
                header_timeout=s.header_timeout,
                read_timeout=s.read_timeout,
                max_body_bytes=s.max_body_bytes,
                worker_connections=connections,
                client_connections=s.client_connections,
                client_rate=s.client_rate,
            )
        )
        self.nginx_connections = connections
        cmd = [self.settings.nginx, "-c", str(conf), "-p", str(self.temp), "-e", str(error_log)]
        self.nginx = start_child(cmd, self.log_dir / "nginx.log", open_files=open_files)
        host = "127.0.0.1" if self.settings.host in ("0.0.0.0", "") else self.settings.host
        url = f"http://{host}:{self.port}/ready"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            self._check_stop()
            if self.nginx.poll() is not None:
                raise RuntimeError(
                    f"nginx exited with {self.nginx.returncode}: "
                    f"{log_tail(self.log_dir / 'nginx.log') or log_tail(error_log)}"
                )
            if get_json(url)[0] == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer on port {self.port}; see {error_log}")

    def _watch(self) -> None:
        while True:
            self._check_stop()
            if self.nginx is not None and self.nginx.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.nginx.returncode}; see {self.log_dir}")
            if self.roll_requested:
                self.roll_requested = False
                self.roll()
            for replica in self.replicas:
                self._revive(replica)
            self.bound_logs()
            time.sleep(0.2)

    def bound_logs(self) -> None:
        """Every log this run's children write kept under ``max_log_bytes``: the replicas', and nginx's (nginx*.log)."""
        for replica in self.replicas:
            if bound_log(replica.log_path, self.settings.max_log_bytes):
                replica.log_offset = 0
        for path in sorted({*self.log_dir.glob("nginx*.log"), *self.temp.glob("nginx*.log")}):
            bound_log(path, self.settings.max_log_bytes)

    def _revive(self, replica: Replica) -> None:
        """Start a replica that exited by itself again (nginx routes around it meanwhile)."""
        if replica.proc is None:
            return
        if replica.alive():
            replica.seen_ready()  # a replica started again after a crash: a roll waits until nginx has it back
            if replica.failures and time.monotonic() - replica.started_at > 60:
                replica.failures = 0  # up for a minute: the next exit starts it again at once
            return
        backoff = min(30.0, 0.5 * 2**replica.failures)
        if time.monotonic() - replica.started_at < backoff:
            return
        self.say(
            f"replica {replica.index} (port {replica.port}) exited with {replica.proc.returncode}: starting it again"
        )
        replica.failures += 1
        replica.start(replica.checkpoint or os.path.realpath(self.settings.checkpoint))

    def roll(self) -> None:
        """Restart the replicas one at a time (on the checkpoint ``--checkpoint`` names now): none is lost."""
        target = os.path.realpath(self.settings.checkpoint)
        self.say(f"rolling restart onto {target}")
        for replica in self.replicas:
            try:  # one away at a time: every other one (restarted after a crash, or just replaced) back in rotation
                self._wait_in_rotation([r for r in self.replicas if r is not replica])
            except RuntimeError as exc:
                self.say(f"roll stopped before replica {replica.index}: {exc}")
                return
            previous = replica.checkpoint or target
            replica.stop(timeout=self.settings.read_timeout)
            replica.start(target)
            try:
                self._wait_ready(replica)
            except RuntimeError as exc:
                self.say(f"roll stopped: {exc}; replica {replica.index} goes back to {previous}")
                replica.stop()
                replica.start(previous)
                return
            self.say(f"replica {replica.index} serves model version {self._version(replica)}")
        self._wait_in_rotation(self.replicas)
        self.say("rolling restart done")

    def _shutdown(self) -> None:
        # SIGQUIT: nginx's graceful stop, it finishes what it holds
        stop_processes(self.nginx, grace_s=self.settings.read_timeout, sig=signal.SIGQUIT)
        stop_processes(*(replica.proc for replica in self.replicas), grace_s=self.settings.read_timeout)


def _limits(s: ReplicaSettings) -> str:
    connections = f"{s.client_connections} requests at once" if s.client_connections else "any number at once"
    rate = f"{s.client_rate} a second" if s.client_rate else "at any rate"
    return f"{connections}, {rate} (--client-connections, --client-rate)"


def parse_serve_args(extra: list[str]) -> argparse.Namespace:
    """The `distrinews serve` flags given to serve-replicas (passed to every replica), checked here."""
    from .options import add_arguments

    parser = argparse.ArgumentParser(prog="distrinews serve-replicas", add_help=False)
    add_arguments(parser)
    try:
        args, unknown = parser.parse_known_args(extra)
    except SystemExit:
        raise ServeOptionError(
            f"serve-replicas: these flags are not flags of distrinews serve: {' '.join(extra)}"
        ) from None
    if unknown:
        raise ServeOptionError(
            f"serve-replicas: unknown flags {' '.join(unknown)} (flags of distrinews serve are passed to every replica)"
        )
    return args

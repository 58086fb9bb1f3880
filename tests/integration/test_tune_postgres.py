"""``distrinews tune`` as a team runs it: two tuners on two hosts share one study on a PostgreSQL server.

A real PostgreSQL (Debian's ``postgresql`` package: ``initdb`` and ``pg_ctl`` into a temporary folder, run as
``nobody``) listens on test host A's address (conftest ``two_hosts``: network namespaces joined by a veth pair);
a tuner runs on each host and reaches it over the link with a password-protected account. Each is given the URL,
password included, off its command line: tuner A in ``$DISTRINEWS_TUNE_STORAGE``, tuner B in ``--storage-file``.

- Trials are shared and none runs twice; a tuner SIGKILLed mid-trial leaves a trial that the other tuner fails
  once its heartbeat is stale and runs again (``RetryHeartbeatStaleTrialCallback``); the password appears in no
  process's command line and no file the tuners and their trials wrote.
- The database stopped while both tuners' trials run, and started again after one of them ended, costs at most a
  retry: both tuners finish the study, each with one warning line and no traceback.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import NEWS_DATA, QUIET, ROOT, TINY, in_host, killed_after, require, unavailable, wait_until

optuna = require("optuna")

from optuna.storages import RetryHeartbeatStaleTrialCallback  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

SPACE = "learning_rate: {low: 1.0e-4, high: 3.0e-3, log: true}\n"
# One evaluation, at the last of 2 steps, on 32 rows: a trial is mostly its process starting.
TRIAL = (
    *TINY,
    *NEWS_DATA,
    "--max_steps", "2",
    "--eval_steps", "2",
    "--train_samples", "32",
    "--eval_samples", "32",
    *QUIET,
)  # fmt: skip
# A beat a second, stale after 3 s without one: a dead tuner's trial runs again within seconds.
HEARTBEAT = ("--heartbeat-interval", "1", "--grace-period", "3")
PORT = 5432
DATABASE = "optuna"
ACCOUNT = "tuner"


def _server_programs() -> Path:
    """The folder of ``initdb``, ``pg_ctl`` and ``createdb``: the one ``pg_ctl`` on the PATH links to, else Debian's
    (one folder per major version, none on the PATH)."""
    on_path = shutil.which("pg_ctl")
    if on_path and (found := Path(on_path).resolve().parent / "createdb").is_file():
        return found.parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        unavailable("PostgreSQL's server programs (initdb, pg_ctl) are missing: apt-get install postgresql")
    return found[-1].parent


class Postgres:
    """A PostgreSQL server of the test's own on ``host``'s ``address``, run as ``nobody`` (it refuses root) from a
    folder outside pytest's (which ``nobody`` may not enter). Its one account, ``ACCOUNT``, logs in with a password
    over the network (scram-sha-256) and without one over the folder's Unix socket, which only ``nobody`` and root
    reach: that is how the test reads the study."""

    def __init__(self, host: str, address: str):
        self.host, self.address = host, address
        self.bin = _server_programs()
        self.user = pwd.getpwnam("nobody")
        self.folder = Path(tempfile.mkdtemp(prefix="dn-pg-"))
        os.chown(self.folder, self.user.pw_uid, self.user.pw_gid)
        self.data, self.log = self.folder / "data", self.folder / "server.log"
        self.password = secrets.token_urlsafe(18)
        self.url = f"postgresql+psycopg://{ACCOUNT}:{self.password}@{address}:{PORT}/{DATABASE}"
        self.local_url = f"postgresql+psycopg://{ACCOUNT}@/{DATABASE}?host={self.folder}&port={PORT}"

    def _run(self, program: str, *args: str) -> str:
        command = in_host(
            self.host,
            "setpriv",
            f"--reuid={self.user.pw_uid}",
            f"--regid={self.user.pw_gid}",
            "--clear-groups",
            "--",
            str(self.bin / program),
            *args,
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.folder)
        assert done.returncode == 0, f"{program} {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def init(self) -> Postgres:
        secret = self.folder / "password"
        secret.write_text(self.password + "\n")
        os.chown(secret, self.user.pw_uid, self.user.pw_gid)
        secret.chmod(0o600)
        try:
            self._run(
                "initdb",
                "-D", str(self.data),
                "-U", ACCOUNT,
                f"--pwfile={secret}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E", "UTF8",
                "--no-sync",
                "--no-instructions",
            )  # fmt: skip
        finally:
            secret.unlink()
        with open(self.data / "pg_hba.conf", "a") as hba:
            hba.write(f"host {DATABASE} {ACCOUNT} {self.address.rsplit('.', 1)[0]}.0/24 scram-sha-256\n")
        self.start()
        self._run("createdb", "-h", str(self.folder), "-p", str(PORT), "-U", ACCOUNT, DATABASE)
        return self

    def start(self) -> None:
        options = f"-c listen_addresses={self.address} -c port={PORT} -c unix_socket_directories={self.folder}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-m", mode, "stop")

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                in_host(self.host, "setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                        "--clear-groups", "--", str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-m",
                        "immediate", "stop"),
                capture_output=True,
                timeout=120,
            )  # fmt: skip
        shutil.rmtree(self.folder, ignore_errors=True)

    def storage(self) -> optuna.storages.RDBStorage:
        """The studies, as the test reads them: over the Unix socket, from this (root's) network namespace."""
        return optuna.storages.RDBStorage(self.local_url, engine_kwargs={"pool_pre_ping": True})


@pytest.fixture
def postgres(two_hosts):
    require("psycopg", "SQLAlchemy's PostgreSQL driver: pip install 'distrinews[tune]'")
    host, _, address = two_hosts[0]
    server = Postgres(host, address)
    try:
        yield server.init()
    finally:
        server.close()


def _tuner(host: str, server: Postgres, folder: Path, study: str, n_trials: int) -> subprocess.Popen:
    """``distrinews tune`` on ``host`` against ``study`` on ``server``, its study folder and output in ``folder``; the
    storage's URL in ``$DISTRINEWS_TUNE_STORAGE`` for a folder named ``a``, else in ``--storage-file``."""
    folder.mkdir()
    (folder / "space.yaml").write_text(SPACE)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if folder.name == "a":
        env["DISTRINEWS_TUNE_STORAGE"], storage = server.url, []
    else:
        (folder / "storage").write_text(server.url + "\n")
        (folder / "storage").chmod(0o600)
        storage = ["--storage-file", str(folder / "storage")]
    command = in_host(
        host,
        sys.executable, "-m", "distrinews", "tune",
        "--space", str(folder / "space.yaml"),
        "--output-dir", str(folder / "study"),
        *storage,
        "--study-name", study,
        "--n-trials", str(n_trials),
        "--pruner", "none",
        *HEARTBEAT,
        *TRIAL,
    )  # fmt: skip
    out, err = open(folder / "stdout", "w"), open(folder / "stderr", "w")
    try:
        return subprocess.Popen(command, stdout=out, stderr=err, text=True, cwd=ROOT, env=env)
    finally:
        out.close()
        err.close()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _running(storage, study: str, tuner: subprocess.Popen | None = None) -> list:
    """The study's trials running with a live training process (``tuner``'s only, when given)."""
    try:
        trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # not made yet
        return []
    mine = None if tuner is None else f"{socket.gethostname()}:{tuner.pid}"
    return [
        t
        for t in trials
        if t.state == TrialState.RUNNING
        and (mine is None or t.user_attrs.get("tuner") == mine)
        and (pid := t.user_attrs.get("pid"))
        and _alive(pid)
    ]


class CommandLines:
    """Every process's command line on this machine, read every 0.1 s while it watches: ``.holding(secret)`` the
    ones that held it, ``.tuners`` how many readings saw a ``distrinews tune`` and a ``distrinews train``."""

    def __init__(self, secret: str):
        self.secret, self.seen, self.tuners = secret, set[str](), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            lines = []
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    with contextlib.suppress(OSError):  # ended meanwhile
                        lines.append(
                            Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                        )
            self.seen.update(line for line in lines if self.secret in line)
            if any(" tune " in line for line in lines) and any(" train " in line for line in lines):
                self.tuners += 1

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


def _files_holding(secret: str, *places: Path) -> list[Path]:
    """The files in ``places`` (files, or folders searched through) that hold ``secret``, tuner B's storage file
    aside."""
    files = [f for place in places for f in ([place] if place.is_file() else place.rglob("*"))]
    return [
        f
        for f in files
        if f.is_file() and not f.is_symlink() and f.name != "storage" and secret.encode() in f.read_bytes()
    ]


def test_two_tuners_on_two_hosts_share_a_study_and_a_killed_tuners_trial_runs_again(
    two_hosts, postgres, tmp_path, news_corpus
):
    (host_a, _, _), (host_b, _, _) = two_hosts
    storage, study_name = postgres.storage(), "shared"
    with (
        CommandLines(postgres.password) as ps,
        killed_after(_tuner(host_a, postgres, tmp_path / "a", study_name, 2)) as a,
        killed_after(_tuner(host_b, postgres, tmp_path / "b", study_name, 2)) as b,
    ):
        # Tuner B's trial is running on host B: B is pulled out from under it (SIGKILL: nothing of it runs on).
        (killed,) = wait_until(lambda: _running(storage, study_name, b), 300, "tuner B's trial to run", 0.2)
        b.kill()
        b.wait()
        # Its training process dies with it (SIGTERM from the kernel: it saves and stops).
        wait_until(lambda: not _alive(killed.user_attrs["pid"]), 120, "the killed tuner's trial to end", 0.2)
        a.wait(300)
    out_a = (tmp_path / "a" / "stdout").read_text()
    assert a.returncode == 0, out_a + (tmp_path / "a" / "stderr").read_text()

    trials = optuna.load_study(study_name=study_name, storage=storage).trials
    by_state = {s: [t for t in trials if t.state == s] for s in TrialState}
    # The killed trial failed once its heartbeat was stale, and ran again, with its parameters, as a new trial.
    assert [t.number for t in by_state[TrialState.FAIL]] == [killed.number], out_a
    retry = [t for t in trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(t) == killed.number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == killed.params
    assert f"trial {retry[0].number} (retries trial {killed.number})" in out_a
    # The study has its 2 trials; each ran in one tuner, once: its log is in one host's study folder only.
    assert len(by_state[TrialState.COMPLETE]) == 2 and len(trials) == 3
    tuner_a = f"{socket.gethostname()}:{a.pid}"
    assert {t.user_attrs["tuner"] for t in by_state[TrialState.COMPLETE]} == {tuner_a}
    assert killed.user_attrs["tuner"] == f"{socket.gethostname()}:{b.pid}"
    logs = sorted(p.name for host in "ab" for p in (tmp_path / host / "study" / "trials").glob("trial-*.log"))
    assert logs == sorted(f"trial-{t.number}.log" for t in trials)
    assert (tmp_path / "a" / "study" / "best-config.yaml").is_file()

    # The password: in no command line (read 10 times a second throughout), no file of the tuners' or trials', no
    # line they printed, nor the server's log.
    assert ps.tuners > 10 and not ps.seen
    assert f"in postgresql+psycopg://tuner:***@{postgres.address}:" in out_a
    assert not _files_holding(postgres.password, tmp_path, postgres.log)
    print(f"--- host a\n{out_a}--- host b\n{(tmp_path / 'b' / 'stdout').read_text()}")


def _trial_files(folder: Path, pattern: str, holding: str = "") -> list[Path]:
    found = (folder / "study" / "trials").glob(pattern) if (folder / "study" / "trials").is_dir() else []
    return [f for f in found if holding in f.read_text(errors="replace")]


def test_the_database_restarted_mid_study_costs_at_most_a_retry(two_hosts, postgres, tmp_path, news_corpus):
    (host_a, _, _), (host_b, _, _) = two_hosts
    storage, study_name = postgres.storage(), "restarted"
    with (
        killed_after(_tuner(host_a, postgres, tmp_path / "a", study_name, 2)) as a,
        killed_after(_tuner(host_b, postgres, tmp_path / "b", study_name, 2)) as b,
    ):
        # Both tuners' trials train, each reporting to the study, when the server stops.
        wait_until(
            lambda: all(_trial_files(tmp_path / h, "trial-*.log", "Optuna: reporting") for h in "ab"),
            300,
            "a trial training on each host",
            0.2,
        )
        pids = [t.user_attrs["pid"] for t in _running(storage, study_name)]
        assert len(pids) == 2
        storage.engine.dispose()
        postgres.stop()
        # A trial's training ends while the server is down: its tuner cannot tell the study the outcome, and neither
        # tuner's heartbeat is recorded.
        wait_until(lambda: not all(_alive(pid) for pid in pids), 300, "a trial to end", 0.2)
        time.sleep(4)  # past the grace period (3 s): every heartbeat is stale by the server's clock when it is back
        postgres.start()
        a.wait(300)
        b.wait(300)
    outs = {h: (tmp_path / h / "stdout").read_text() + (tmp_path / h / "stderr").read_text() for h in "ab"}
    for out in outs.values():
        assert "Traceback" not in out and "UserWarning" not in out, out
    assert a.returncode == 0 and b.returncode == 0, outs
    assert any("warning: the study's storage did not answer (trial " in out for out in outs.values()), outs
    trials = optuna.load_study(study_name=study_name, storage=storage).trials
    assert len([t for t in trials if t.state == TrialState.COMPLETE]) == 2, outs
    # A trial failed as stale when the server came back (its tuner's beats had stopped with it) ran again.
    retried = {RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials}
    assert all(t.number in retried for t in trials if t.state == TrialState.FAIL), outs
    assert len(trials) <= 3, outs  # at most one retry
    print("\n".join(f"--- host {h}\n{out}" for h, out in outs.items()))

"""A child run to its end by ``run_until_stopped`` is stopped by Ctrl-C or SIGTERM, whenever the signal comes; and
``stop_processes`` stops children: a signal, a grace, SIGKILL only for one that outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from distrinews.distributed.lifetime import run_until_stopped, stop_processes

_ARMED: list[bool] = []


def _term_self_once() -> None:
    """An at-fork hook: SIGTERM to this process while it forks, once per arming (the hook stays registered)."""
    if _ARMED:
        _ARMED.clear()
        os.kill(os.getpid(), signal.SIGTERM)


os.register_at_fork(before=_term_self_once)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _sleeper(tmp_path) -> list[str]:
    """A child that sleeps 20 s, then leaves a file ``finished``: stopped, it leaves none."""
    return [
        sys.executable,
        "-c",
        f"import time, pathlib; time.sleep(20); pathlib.Path({str(tmp_path)!r}, 'finished').touch()",
    ]


def test_sigterm_that_comes_while_the_child_is_forked_stops_the_child_and_raises(tmp_path):
    # Raised there, the handler's KeyboardInterrupt is swallowed by the at-fork hooks: the child would sleep its 20 s
    # and the call return 0.
    started: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    _ARMED.append(True)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_until_stopped(_sleeper(tmp_path), 10.0, started=started.append, preexec_fn=lambda: None)
    finally:
        _ARMED.clear()
    assert started and _gone(started[0]) and not (tmp_path / "finished").exists()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_another_thread_takes_still_stops_the_child(tmp_path):
    # A plain wait is not interrupted when the kernel gives the signal to another thread (a heartbeat thread), and
    # Python may not run the handler until the child ends.
    before = signal.getsignal(signal.SIGINT)
    if before == signal.SIG_IGN:  # started under nohup: SIGINT stays ignored, as it should
        signal.signal(signal.SIGINT, signal.default_int_handler)
    done = threading.Event()
    other = threading.Thread(target=done.wait, daemon=True)
    other.start()
    started: list[int] = []

    def signal_the_other_thread(pid: int) -> None:
        started.append(pid)
        threading.Timer(0.3, signal.pthread_kill, (other.ident, signal.SIGINT)).start()

    try:
        with pytest.raises(KeyboardInterrupt):
            run_until_stopped(_sleeper(tmp_path), 10.0, started=signal_the_other_thread)
    finally:
        done.set()
        restored = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, before)
    assert started and _gone(started[0]) and not (tmp_path / "finished").exists()
    assert restored is signal.default_int_handler


def test_an_ignored_stop_signal_stays_ignored(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup
    try:
        code = "import os, signal, time; os.kill(os.getppid(), signal.SIGINT); time.sleep(0.5)"
        assert run_until_stopped([sys.executable, "-c", code], 5.0) == 0
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_child_that_ends_returns_its_exit_code():
    assert run_until_stopped([sys.executable, "-c", "raise SystemExit(3)"], 5.0) == 3


def _child(on_sigterm: str) -> subprocess.Popen[str]:
    """A child that handles SIGTERM with ``on_sigterm`` (Python statements), started once it has said so."""
    code = (
        "import signal, sys, time\n"
        f"def on_term(signum, frame):\n    {on_sigterm}\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
        "sys.exit(9)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace():
    stubborn = _child("pass")
    stop_processes(stubborn, grace_s=0.5)
    assert stubborn.returncode == -signal.SIGKILL


def test_a_child_that_exits_on_sigterm_is_not_killed():
    # it finishes what it holds and exits 3 of its own: a SIGKILL would read -9
    obliging = _child("time.sleep(0.2); sys.exit(3)")
    stop_processes(obliging, grace_s=30.0)
    assert obliging.returncode == 3


def test_one_grace_for_several_children_and_the_signal_asked_for():
    stubborn, obliging = _child("pass"), _child("sys.exit(4)")
    stop_processes(stubborn, None, obliging, grace_s=0.5)
    assert (stubborn.returncode, obliging.returncode) == (-signal.SIGKILL, 4)
    interrupted = _child("pass")  # SIGTERM ignored, SIGINT (Python's KeyboardInterrupt) not
    stop_processes(interrupted, grace_s=30.0, sig=signal.SIGINT)
    assert interrupted.returncode == -signal.SIGINT


def test_a_child_already_ended_or_none_is_left_as_it_is():
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(5)"])
    while not _gone_or_zombie(ended.pid):
        threading.Event().wait(0.05)
    stop_processes(ended, None, grace_s=0.5)  # exited but not reaped: reaped, its own code kept
    assert ended.returncode == 5
    stop_processes(ended, grace_s=0.5)  # reaped already: nothing to signal
    assert ended.returncode == 5
    stop_processes(grace_s=0.5)


def _gone_or_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True

"""The files ``serve-replicas`` reads and writes, provoked in process: a log of weeks is read back by its end only,
every log its children write is kept under ``--max-log-bytes`` while they write it, and the pid file is never
written through a link planted at its path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import unavailable
from distrinews.distributed.lifetime import TAIL_BYTES, log_tail
from distrinews.serve.children import address_taken, bound_log
from distrinews.serve.replicas import ReplicaSettings, Supervisor

BIG = 512 * 1024 * 1024  # a sparse file: no disk, but reading it whole would read half a GiB


def _bytes_read() -> int:
    """This process's bytes read by read(2) and pread(2) so far (Linux's /proc/self/io ``rchar``)."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        unavailable("/proc/self/io is not readable here: the bytes a read takes cannot be counted")
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("rchar:")))


def _big_log(path: Path, end: bytes) -> Path:
    with open(path, "wb") as f:
        f.truncate(BIG - len(end))
        f.seek(BIG - len(end))
        f.write(end)
    return path


def test_the_end_of_a_huge_log_is_read_without_reading_the_rest(tmp_path):
    end = b"".join(b"line %d\n" % i for i in range(100)) + b"ERROR: address already in use\n"
    log = _big_log(tmp_path / "replica-0.log", end)
    before = _bytes_read()
    tail = log_tail(log)
    taken = address_taken(log)
    read = _bytes_read() - before
    assert tail.splitlines()[-1] == "ERROR: address already in use" and len(tail.splitlines()) == 15
    assert taken
    assert read <= 4 * TAIL_BYTES, f"{read:,} bytes read for the end of a {BIG:,}-byte log"


def test_a_tail_starts_at_a_whole_line_and_an_offset_past_the_end_counts_from_the_start(tmp_path):
    log = tmp_path / "a.log"
    log.write_bytes(b"x" * 100 + b"\nsecond\nthird\n")
    assert log_tail(log, lines=None, max_bytes=20) == "second\nthird\n"  # not the x's the read started among
    assert log_tail(tmp_path / "missing.log") == ""
    log.write_bytes(b"bind() failed: Address already in use\n")  # emptied and written again since the offset
    assert address_taken(log, offset=10_000)


def test_a_log_its_child_appends_to_is_cut_in_place_and_the_child_writes_on_from_its_start(tmp_path):
    log = tmp_path / "replica-0.log"
    child = open(log, "ab")  # as start_child opens it for the child: O_APPEND
    try:
        child.write(b"a" * 3000 + b"\n")
        child.flush()
        assert not bound_log(log, max_bytes=4096)
        child.write(b"b" * 3000 + b"\n")
        child.flush()
        assert bound_log(log, max_bytes=4096)
        assert log.stat().st_size == 0
        assert (tmp_path / "replica-0.log.1").read_bytes() == (b"a" * 3000 + b"\n" + b"b" * 3000 + b"\n")[-4096:]
        child.write(b"after\n")
        child.flush()
        assert log.read_bytes() == b"after\n"  # at the start, not at its old offset past a hole
    finally:
        child.close()


def test_a_log_that_is_a_link_is_neither_read_nor_cut(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"v" * 10_000)
    (tmp_path / "nginx-access.log").symlink_to(victim)
    assert not bound_log(tmp_path / "nginx-access.log", max_bytes=100)
    assert log_tail(tmp_path / "nginx-access.log") == ""
    assert victim.read_bytes() == b"v" * 10_000


def test_the_supervisor_keeps_every_log_of_its_children_under_the_bound(tmp_path):
    logs = tmp_path / "logs"
    supervisor = Supervisor(
        ReplicaSettings(checkpoint=str(tmp_path), replicas=2, log_dir=str(logs), max_log_bytes=64 * 1024)
    )
    try:
        names = ["replica-0.log", "replica-1.log", "nginx.log", "nginx-access.log", "nginx-error.log"]
        for name in names:
            (logs / name).write_bytes(b"GET /predict 200\n" * 10_000)
        supervisor.replicas[0].log_offset = 170_000
        supervisor.bound_logs()
        for name in names:
            assert (logs / name).stat().st_size == 0, name
            assert (logs / f"{name}.1").stat().st_size == 64 * 1024, name
        assert supervisor.replicas[0].log_offset == 0
    finally:
        supervisor.temp.rmdir()


def test_the_pid_file_is_never_written_through_a_planted_link(tmp_path, monkeypatch):
    """A link planted at --pid-file's path would have the supervisor overwrite what it points to."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    pid_file = tmp_path / "serve.pid"
    pid_file.symlink_to(victim)
    seen = {}

    def start(replica, checkpoint):  # the pid file is written before the first replica starts: look at it then
        seen["link"] = pid_file.is_symlink()
        seen["pid"] = pid_file.read_text()
        raise RuntimeError("stop here")

    monkeypatch.setattr("distrinews.serve.replicas.Replica.start", start)
    supervisor = Supervisor(ReplicaSettings(checkpoint=str(tmp_path), replicas=1, pid_file=str(pid_file)))
    supervisor.say = lambda message: None
    try:
        assert supervisor.run() == 1
    finally:
        shutil.rmtree(supervisor.temp)
    assert victim.read_text() == "precious\n"
    assert seen == {"link": False, "pid": f"{os.getpid()}\n"}
    assert not pid_file.exists() and not pid_file.is_symlink()  # removed at the end, the victim left alone


def test_a_pid_file_path_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    from distrinews.serve.options import ServeOptionError

    pid_file = tmp_path / "serve.pid"
    pid_file.mkdir()
    (pid_file / "inside").write_text("kept\n")
    supervisor = Supervisor(ReplicaSettings(checkpoint=str(tmp_path), replicas=1, pid_file=str(pid_file)))
    try:
        with pytest.raises(ServeOptionError, match=r"--pid-file .*serve.pid: cannot write it"):
            supervisor.run()
    finally:
        shutil.rmtree(supervisor.temp)
    assert (pid_file / "inside").read_text() == "kept\n"

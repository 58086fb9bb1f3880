"""``distrinews predict --input/--output`` killed for real: SIGKILL mid-run, the same command again, every row exactly
once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, killed_after, news_rows, wait_until
from distrinews.checkpoint.file_lock import FileLock
from distrinews.predict.batch.state import StateDir, state_dir_of

ROWS = 2_000

# Small passes, so the run is many commits long and the kill lands in the middle of it.
ARGS = ("--nproc", "2", "--threads", "1", "--batch-size", "4", "--id-field", "id", "--probabilities")


def news_texts(n: int) -> list[str]:
    """``n`` AG-News-shaped texts (title and description) of the corpus the tests make: no data needed."""
    return [f"{title} {description}" for _, title, description in news_rows(n, random.Random(n))]


@pytest.fixture(scope="module")
def job(tmp_path_factory, spread_checkpoint, write_rows):
    root = tmp_path_factory.mktemp("predict-kill")
    texts = news_texts(ROWS)
    checkpoint = spread_checkpoint(root / "best", texts[:256])
    corpus = write_rows(root / "news.jsonl", [{"id": f"n{i}", "text": t} for i, t in enumerate(texts)])
    return root, checkpoint, corpus, ["predict", "--checkpoint", str(checkpoint), "--input", str(corpus), *ARGS]


def uninterrupted(checkpoint, corpus, output):
    """The same job run whole, in this process (one worker, larger passes: the labels are the same)."""
    import io

    import torch

    from distrinews.predict.batch.engine import run
    from distrinews.predict.batch.job import BatchJob
    from distrinews.predict.predictor import Predictor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        job = BatchJob(str(checkpoint), [str(corpus)], str(output), id_field="id", probabilities=True, progress="none")
        assert run(job, stdout=io.StringIO(), predictor=Predictor(checkpoint, device="cpu")) == 0
    finally:
        torch.set_num_threads(threads)
    return [json.loads(line) for line in output.read_text().splitlines()]


def _lines(pipe, timeout: float):
    """The lines of a text pipe until it closes; an AssertionError when none comes for ``timeout`` s. (A thread
    reads: select() on the pipe would miss lines already in the file object's buffer.)"""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in pipe:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output for {timeout:g} s") from None
        if line is None:
            return
        yield line


def done_rows(state: StateDir) -> int:
    total = 0
    for path in state.path.glob("worker-*/manifest.json"):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        total += manifest["done_through"] - manifest["start"] + len(manifest["window_done"])
    return total


def test_sigkill_mid_run_then_the_same_command_finishes_with_every_row_once(job, cli, padding_atol):
    root, checkpoint, corpus, args = job
    output = root / "out.jsonl"
    state = StateDir(state_dir_of(output))
    # stderr to a file: a pipe nobody reads while the run goes on could fill and stall it
    stderr = root / "killed.stderr"
    with (
        stderr.open("w") as err,
        killed_after(
            subprocess.Popen(
                [sys.executable, "-m", "distrinews", *args, "--output", str(output)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
                text=True,
                start_new_session=True,  # the finally kills its workers too, should they outlive it
            ),
            group=True,
        ) as proc,
    ):

        def far_enough() -> bool:
            assert proc.poll() is None, f"the run ended before it could be killed: {stderr.read_text()}"
            return done_rows(state) >= ROWS // 5

        wait_until(far_enough, 180, f"{ROWS // 5} rows committed")
        proc.send_signal(signal.SIGKILL)  # the parent alone: its workers must die with it
        proc.wait(30)
        killed_at = done_rows(state)
        assert ROWS // 5 <= killed_at < ROWS
        assert not output.exists()  # never a half-written output
        # The workers are gone (PR_SET_PDEATHSIG): their locks are free. Checked before the group kill on leaving
        # the block, which would hide a worker that outlived its parent.
        for path in state.path.glob("worker-*/lock"):
            lock = FileLock(path)
            assert lock.acquire(wait_s=10), f"{path.parent.name} outlived its parent"
            lock.release()

    again = cli(*args, "--output", str(output))
    assert (
        "done by an earlier run" in again.stdout
        and f"{ROWS:,} rows read, {ROWS:,} labelled, 0 rejected" in again.stdout
    )
    got = [json.loads(line) for line in output.read_text().splitlines()]
    want = uninterrupted(checkpoint, corpus, root / "uninterrupted.jsonl")
    assert [r["id"] for r in got] == [f"n{i}" for i in range(ROWS)]  # every row exactly once, in input order
    assert [r["label"] for r in got] == [r["label"] for r in want]
    for a, b in zip(got, want):
        assert list(a["probabilities"].values()) == pytest.approx(list(b["probabilities"].values()), abs=padding_atol)
    assert not state.path.exists() and not output.with_name(output.name + ".rejects.jsonl").exists()
    assert len({r["label"] for r in got}) > 1  # the model tells texts apart: equal labels mean something


def test_runtime_auto_makes_the_int8_model_once_before_the_workers_start(tmp_path, spread_checkpoint, write_rows):
    """Two workers on a checkpoint without its int8 model: the parent makes it (and says what the workers
    will run) before they start; they load that file rather than each making and publishing another."""
    from distrinews.predict.derived import INT8_FILE, DerivedFiles

    texts = news_texts(400)
    checkpoint = spread_checkpoint(tmp_path / "best", texts[:256])
    corpus = write_rows(tmp_path / "news.jsonl", [{"id": f"n{i}", "text": t} for i, t in enumerate(texts)])
    assert DerivedFiles(checkpoint).read(INT8_FILE) is None
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distrinews",
            "predict",
            "--checkpoint",
            str(checkpoint),
            "--input",
            str(corpus),
            "--output",
            str(tmp_path / "out.jsonl"),
            *ARGS,
            "--runtime",
            "auto",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    with killed_after(proc, group=True):
        lines, stream = [], _lines(proc.stderr, 300)
        for line in stream:  # the parent's lines, up to the one it writes before starting the workers
            lines.append(line)
            if line.startswith("predict: runtime auto: "):
                break
        else:
            pytest.fail(f"no 'runtime auto' line before the workers started: {''.join(lines)}")
        made = DerivedFiles(checkpoint).read(INT8_FILE)  # kept in the cache by the parent, before any worker exists
        assert made is not None
        inode = made.path.stat().st_ino
        rest = "".join(stream)
        assert proc.wait(timeout=300) == 0, rest
    assert DerivedFiles(checkpoint).read(INT8_FILE) == made and made.path.stat().st_ino == inode, (
        "a worker made and published the int8 model again"
    )
    assert "predict: runtime auto: " not in rest and sum(1 for _ in (tmp_path / "out.jsonl").open()) == 400


# Runs `distrinews ARGS` paused once its checks are made (the output is not there yet) until a file appears: a
# second run caught before it writes anything, held there for as long as the test needs.
PAUSED_AFTER_CHECKS = """
import sys, time
from pathlib import Path
from distrinews.predict.batch import engine

paused, go = Path(sys.argv[1]), Path(sys.argv[2])
check = engine.check

def pausing(job):
    checked = check(job)
    paused.touch()
    deadline = time.monotonic() + 600  # the test touches ``go``, or is gone: never wait for ever
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return checked

engine.check = pausing
from distrinews.cli import main
sys.argv = ["distrinews", *sys.argv[3:]]
sys.exit(main())
"""


def test_a_run_that_started_before_another_finished_is_refused_and_the_finished_output_kept(
    job, tmp_path, cli, write_rows
):
    _, checkpoint, _, _ = job
    corpus = write_rows(tmp_path / "few.jsonl", [{"text": f"Stocks rally on earnings, day {i}"} for i in range(20)])
    output = tmp_path / "out.jsonl"
    args = [
        "predict",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(corpus),
        "--output",
        str(output),
        "--progress",
        "none",
    ]
    paused, go = tmp_path / "paused", tmp_path / "go"
    second = subprocess.Popen(
        [sys.executable, "-c", PAUSED_AFTER_CHECKS, str(paused), str(go), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def checked() -> bool:
            assert second.poll() is None, f"the second run ended before its checks: {second.communicate()}"
            return paused.exists()

        wait_until(checked, 120, "the second run to finish its checks")
        cli(*args)  # the first run, start to finish, while the second waits
        finished = output.stat()
        go.touch()
        out, err = second.communicate(timeout=120)
    finally:
        if second.poll() is None:
            second.kill()
            second.wait()
    assert second.returncode == 2, (out, err)
    assert err.strip().splitlines() == [
        f"distrinews: error: predict: {output} already exists (a finished run); pass --overwrite to compute it again"
    ]
    assert (output.stat().st_ino, output.stat().st_mtime_ns) == (finished.st_ino, finished.st_mtime_ns)  # not replaced
    assert not state_dir_of(output).exists()

"""``distrinews predict --input/--output`` for real: hostile rows end in the rejects and the job exits 0, and an
``--overwrite`` interrupted by SIGINT or SIGKILL leaves the published output as it was."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT, hostile_corpus, killed_after, wait_until
from distrinews.predict.batch.state import StateDir, state_dir_of

ROWS = 400
# One worker, passes of two texts: a few hundred commits, so a signal lands in the middle of the job.
ARGS = ("--runtime", "torch", "--threads", "1", "--batch-size", "2", "--id-field", "id", "--progress", "lines")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, news_corpus, spread_checkpoint):
    root = tmp_path_factory.mktemp("predict-hostile")
    with open(news_corpus / "test.csv", newline="") as fh:
        texts = [f"{title} {description}" for _, title, description in csv.reader(fh)][:ROWS]
    checkpoint = spread_checkpoint(root / "best", texts[:64])
    corpus = root / "news.jsonl"
    rows = [{"id": f"n{i}", "text": t} for i, t in enumerate(texts)]
    rows.insert(7, {"id": "bad", "text": "\ud800 broken"})  # a reject, so there is a rejects file to keep
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root, checkpoint, corpus


def predict(checkpoint, inputs, output, *args) -> list[str]:
    return [
        "predict",
        "--checkpoint",
        str(checkpoint),
        "--input",
        *map(str, inputs),
        "--output",
        str(output),
        *ARGS,
        *args,
    ]


def test_the_issue_s_three_rows_and_every_kind_of_hostile_row_end_in_the_rejects_with_exit_0(setup, tmp_path, cli):
    _, checkpoint, _ = setup
    three = tmp_path / "three.jsonl"
    three.write_text('{"id":"a","text":"good one"}\n{"id":"b","text":"\\ud800 broken"}\n{"id":"c","text":"good two"}\n')
    files, good, expected = hostile_corpus(tmp_path / "in")
    good = ["a", "c", *good]
    expected = [("three.jsonl", 2, "text 'text' contains an unpaired surrogate"), *expected]
    output = tmp_path / "labels.jsonl"
    done = cli(*predict(checkpoint, [three, *files], output))  # exit status 0
    assert f"{len(good)} labelled, {len(expected)} rejected" in done.stdout
    assert [json.loads(line)["id"] for line in output.read_text().splitlines()] == good  # each good row once
    rejects = [json.loads(line) for line in output.with_name(output.name + ".rejects.jsonl").open()]
    got = [(os.path.basename(r["file"]), r["line"], r["reason"][: len(w)]) for r, (*_, w) in zip(rejects, expected)]
    assert got == expected and len(rejects) == len(expected)


def committed(state: StateDir) -> int:
    total = 0
    for path in state.path.glob("worker-*/manifest.json"):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):  # being replaced
            continue
        total += manifest["done_through"] - manifest["start"] + len(manifest["window_done"])
    return total


def test_an_interrupted_overwrite_leaves_the_old_output_and_the_same_command_then_replaces_it(setup, tmp_path, cli):
    _, checkpoint, corpus = setup
    output = tmp_path / "labels.jsonl"
    rejects = output.with_name(output.name + ".rejects.jsonl")
    published = run_in_process(checkpoint, corpus, output)
    state = StateDir(state_dir_of(output))
    overwrite = predict(checkpoint, [corpus], output, "--overwrite")
    for sig in (signal.SIGINT, signal.SIGKILL):  # Ctrl-C, and a kill nothing can handle
        status, said = interrupted(overwrite, sig, state, tmp_path / f"{sig.name}.stderr")
        assert status == (130 if sig == signal.SIGINT else -signal.SIGKILL), said
        assert 20 <= committed(state) <= ROWS + 1
        assert (output.read_bytes(), rejects.read_bytes()) == published  # the published files, untouched
        assert sig == signal.SIGKILL or f"{output} is unchanged" in said
    done = cli(*overwrite)
    assert f"{ROWS + 1:,} rows read, {ROWS:,} labelled, 1 rejected" in done.stdout
    assert "done by an earlier run" not in done.stdout  # --overwrite starts again
    ids = [json.loads(line)["id"] for line in output.read_text().splitlines()]
    assert ids == [f"n{i}" for i in range(ROWS)] and not state.path.exists()
    assert json.loads(rejects.read_text())["line"] == 8


def interrupted(args: list[str], sig: signal.Signals, state: StateDir, stderr_path) -> tuple[int, str]:
    """``distrinews ARGS`` sent ``sig`` once it has committed 20 rows: its exit status and its stderr."""
    # stderr to a file: a pipe nobody reads while the run goes on could stall it
    with (
        stderr_path.open("w") as err,
        killed_after(
            subprocess.Popen(
                [sys.executable, "-m", "distrinews", *args],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            ),
            group=True,
        ) as proc,
    ):

        def under_way() -> bool:
            assert proc.poll() is None, f"the run ended before it could be interrupted: {stderr_path.read_text()}"
            return committed(state) >= 20

        wait_until(under_way, 180, "20 rows committed by the --overwrite run")
        proc.send_signal(sig)
        status = proc.wait(60)
    return status, stderr_path.read_text()


def run_in_process(checkpoint, corpus, output) -> tuple[bytes, bytes]:
    """The job run whole in this process (no interpreter to start): the published files' bytes."""
    import io

    from distrinews.predict.batch.engine import run
    from distrinews.predict.batch.job import BatchJob
    from distrinews.predict.predictor import Predictor

    job = BatchJob(str(checkpoint), [str(corpus)], str(output), id_field="id", runtime="torch", progress="none")
    assert run(job, stdout=io.StringIO(), predictor=Predictor(checkpoint, device="cpu")) == 0
    return output.read_bytes(), output.with_name(output.name + ".rejects.jsonl").read_bytes()

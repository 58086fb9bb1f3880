"""``distrinews predict --engine ray`` on a local Ray with 2 actors: the local engine's answers, rows and rejects.

One small corpus (two shards, JSONL and CSV, with bad rows in both) is labelled by the local engine in
this process and by the Ray engine (2 actors x 1 CPU, ``ray.init(num_cpus=2)``); the passes are cut
small, by texts and by tokens, so the windows and passes must be the local engine's for the numbers to
agree to 1e-5 (texts padded in other company move by up to ``PADDING_ATOL``).
"""

from __future__ import annotations

import io
import json

import pytest

from conftest import require

ray = require("ray", "--engine ray needs Ray Data: pip install 'distrinews[ray]'")
require("ray.data", "--engine ray needs Ray Data: pip install 'distrinews[ray]'")

from distrinews.predict.batch import engine, ray_engine, shell  # noqa: E402
from distrinews.predict.batch.assemble import OutputFiles  # noqa: E402
from distrinews.predict.batch.job import BatchJob  # noqa: E402
from distrinews.predict.batch.state import JOB_FORMAT, state_dir_of  # noqa: E402

ROWS = 40  # good rows; 4 bad ones besides
ATOL = 1e-5
# 4 texts a pass, at most 96 padded tokens: a 32-row window is cut into passes by both limits.
OPTIONS = {
    "batch_size": 4,
    "max_batch_tokens": 96,
    "id_field": "key",
    "probabilities": True,
    "runtime": "torch",
    "progress": "none",
}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        address="local", include_dashboard=False, num_cpus=2, log_to_driver=False
    )  # never a `ray start` cluster here
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, agnews_dir, spread_checkpoint, write_rows):
    """``(checkpoint, [shards])``: 26 JSONL rows (3 bad) then 18 CSV rows (1 bad), ids ``k0``, ``k1``, ..."""
    from distrinews.data.splits import read_csv

    root = tmp_path_factory.mktemp("predict-ray")
    texts = read_csv(agnews_dir / "test.csv.gz").texts[:ROWS]
    checkpoint = spread_checkpoint(root / "best", texts)
    rows = [{"key": f"k{i}", "text": t} for i, t in enumerate(texts)]
    first = root / "part-0.jsonl"
    write_rows(first, rows[:23])
    lines = first.read_bytes().splitlines(keepends=True)
    lines.insert(5, b'{"key": "bad-empty", "text": "  "}\n')  # line 6: empty text
    lines.insert(17, b"this line is not json\n")  # line 18
    lines.insert(20, b'{"key": "bad-surrogate", "text": "\\ud800 broken"}\n')  # line 21: no tokenizer takes it
    first.write_bytes(b"".join(lines))
    second = write_rows(root / "part-1.csv", rows[23:])
    with open(second, "a") as fh:
        fh.write("k-short,only two fields,extra\n")  # line 19: 3 fields, the header has 2
    return checkpoint, [first, second]


def job(checkpoint, inputs, output, **options) -> BatchJob:
    return BatchJob(
        checkpoint=str(checkpoint), inputs=[str(i) for i in inputs], output=str(output), **{**OPTIONS, **options}
    )


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def local_answers(tmp_path_factory, corpus):
    """The local engine's output, rejects and summary line (one worker, in this process)."""
    import torch

    from distrinews.predict.predictor import Predictor

    checkpoint, inputs = corpus
    output = tmp_path_factory.mktemp("local") / "labels.jsonl"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = io.StringIO()
        predictor = Predictor(checkpoint, device="cpu")
        status = engine.run(job(checkpoint, inputs, output), stdout=out, stderr=io.StringIO(), predictor=predictor)
    finally:
        torch.set_num_threads(threads)
    assert status == 0
    return (
        read_jsonl(output),
        read_jsonl(output.with_name(output.name + ".rejects.jsonl")),
        out.getvalue().replace(str(output), "OUT"),
    )


@pytest.fixture(scope="module")
def ray_answers(tmp_path_factory, corpus, local_ray):
    checkpoint, inputs = corpus
    output = tmp_path_factory.mktemp("ray") / "labels.jsonl"
    out = io.StringIO()
    status = ray_engine.run(
        job(checkpoint, inputs, output, engine="ray", nproc=2, threads=1), stdout=out, stderr=io.StringIO()
    )
    assert status == 0
    assert not state_dir_of(output).exists()
    return (
        read_jsonl(output),
        read_jsonl(output.with_name(output.name + ".rejects.jsonl")),
        out.getvalue().replace(str(output), "OUT"),
    )


def test_ray_engine_answers_equal_the_local_engine(local_answers, ray_answers):
    local, _, local_line = local_answers
    got, _, line = ray_answers
    assert [r["id"] for r in got] == [r["id"] for r in local] == [f"k{i}" for i in range(ROWS)]  # input order
    assert [r["label"] for r in got] == [r["label"] for r in local]
    assert len({r["label"] for r in got}) > 1  # the model's answers depend on the text
    for mine, theirs in zip(got, local):
        assert list(mine["probabilities"].values()) == pytest.approx(
            list(theirs["probabilities"].values()), abs=ATOL, rel=0
        )
        assert mine["confidence"] == pytest.approx(theirs["confidence"], abs=ATOL, rel=0)
    assert f"{ROWS + 4} rows read, {ROWS} labelled, 4 rejected" in line
    assert line.split(";")[0] == local_line.split(";")[0]  # the same summary, up to the speed
    assert line.startswith(
        f"predict: {ROWS + 4} rows read, {ROWS} labelled, 4 rejected (see OUT.rejects.jsonl) -> OUT;"
    )


def test_ray_engine_puts_bad_rows_in_rejects_with_file_and_line(corpus, ray_answers, local_answers):
    _, rejects, _ = ray_answers
    where = [(r["file"].rsplit("/", 1)[1], r["line"], r["row"], r["reason"].split(" (")[0]) for r in rejects]
    assert where == [
        ("part-0.jsonl", 6, 5, "empty text in 'text'"),
        ("part-0.jsonl", 18, 17, "not JSON"),
        ("part-0.jsonl", 21, 20, "text 'text' contains an unpaired surrogate"),
        ("part-1.csv", 19, 43, "expected 2 fields"),
    ]
    assert rejects[1]["raw"] == "this line is not json"
    assert rejects == local_answers[1]


def test_ray_engine_writes_csv_and_refuses_a_local_run_s_progress(tmp_path, corpus, local_ray, local_answers):
    checkpoint, inputs = corpus
    output = tmp_path / "labels.csv"
    state = state_dir_of(output)
    state.mkdir()
    (state / "job.json").write_text("{}")  # a local run's progress is not dropped silently
    (state / "worker-0").mkdir()
    (state / "worker-0" / "manifest.json").write_text(
        json.dumps({"worker": 0, "start": 0, "end": 44, "done_through": 32, "format_version": JOB_FORMAT})
    )
    with pytest.raises(engine.ConfigError, match=r"partly computed by the local engine.*--engine local"):
        ray_engine.run(job(checkpoint, inputs, output, engine="ray", nproc=2, threads=1), stdout=io.StringIO())
    assert (state / "job.json").exists() and not output.exists()

    status = ray_engine.run(
        job(
            checkpoint,
            inputs,
            output,
            engine="ray",
            nproc=2,
            threads=1,
            overwrite=True,
            strict=True,
            probabilities=False,
        ),
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    import csv

    rows = list(csv.DictReader(output.open()))
    assert status == shell.EXIT_REJECTED
    assert list(rows[0]) == ["id", "label", "confidence"]
    assert [(r["id"], r["label"]) for r in rows] == [(r["id"], r["label"]) for r in local_answers[0]]
    assert not state.exists()


def test_an_interrupted_overwrite_on_ray_leaves_the_published_output(tmp_path, corpus, local_ray, monkeypatch):
    checkpoint, inputs = corpus
    output = tmp_path / "labels.jsonl"
    rejects = output.with_name(output.name + ".rejects.jsonl")
    output.write_text('{"id": "k0", "label": "World", "confidence": 0.9}\n')  # what an earlier run published
    rejects.write_text('{"file": "part-0.jsonl", "line": 6}\n')

    class Killed(BaseException):
        """Stands in for SIGKILL on the driver, the output half written."""

    real, seen = OutputFiles.add, []

    def killed_midway(self, record):
        seen.append(record)
        if len(seen) == ROWS // 2:
            raise Killed
        real(self, record)

    monkeypatch.setattr(OutputFiles, "add", killed_midway)
    with pytest.raises(Killed):
        ray_engine.run(
            job(checkpoint, inputs, output, engine="ray", nproc=2, threads=1, overwrite=True),
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    assert output.read_text().startswith('{"id": "k0", "label": "World"') and rejects.read_text().startswith('{"file"')
    assert not state_dir_of(output).exists()  # a Ray run keeps no progress: nothing left behind

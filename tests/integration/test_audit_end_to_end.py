"""``distrinews audit`` for real: k-fold training over 2 processes on a corpus with flipped labels planted in it,
killed (SIGKILL of its process group) while a fold trains, and started again with the same command."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from conftest import QUIET, ROOT, TINY, kill, killed_after, wait_until

pytestmark = pytest.mark.slow

# Rows of the made corpus (800 rows, classes in turn) whose label is changed to the next class.
PLANTED = tuple(range(5, 800, 67))  # 12 rows, 3 of each class
# A tiny model learns the made corpus's topics in 100 steps (its test accuracy reaches 100%): 4 epochs of 400 rows
# in steps of 2 x 8.
LEARNS = (
    *("--train_samples", "null", "--num_train_epochs", "4", "--per_device_train_batch_size", "8"),
    *("--learning_rate", "3e-3", "--eval_samples", "32"),
)


@pytest.mark.timeout(600)
def test_a_killed_audit_resumes_without_redoing_work_and_finds_the_planted_labels(tmp_path, news_corpus):
    data = tmp_path / "data"
    data.mkdir()
    rows = list(csv.reader((news_corpus / "train.csv").open()))
    for i in PLANTED:
        rows[i][0] = str(int(rows[i][0]) % 4 + 1)
    with (data / "train.csv").open("w") as fh:
        csv.writer(fh, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    (data / "test.csv").write_bytes((news_corpus / "test.csv").read_bytes())
    out = tmp_path / "audit"
    command = [
        sys.executable, "-m", "distrinews", "audit", *TINY, "--data_dir", str(data), *LEARNS, *QUIET,
        "--save_steps", "0", "--folds", "2", "--output-dir", str(out), "--clean", "drop", "--nproc-per-node", "2",
    ]  # fmt: skip
    # --save_steps 0: a checkpoint at each epoch's end only (every 25 steps; one every 2 steps cost more than the
    # training). The kill lands once the second fold has its first, with three epochs of the fold still to train.
    first, second = out / "folds" / "fold-0", out / "folds" / "fold-1"
    with (tmp_path / "first.log").open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with killed_after(proc, group=True):
            wait_until(
                lambda: proc.poll() is not None or any((second / "run" / "checkpoints").glob("step-*")),
                480,
                "a checkpoint of the second fold's run",
            )
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            kill(proc, group=True)  # the audit, its train launcher and the workers, mid-fold
    assert (first / "done.json").is_file() and not (second / "trained.json").exists()
    first_log, first_done = (first / "fold.log").read_bytes(), (first / "done.json").stat().st_mtime_ns

    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    # The finished fold is not run again; the killed one continues from its checkpoint.
    assert "fold 1/2: done before (400 held-out rows)" in again.stdout
    assert (first / "fold.log").read_bytes() == first_log and (first / "done.json").stat().st_mtime_ns == first_done
    log = (second / "fold.log").read_text()
    assert log.count(" train --config ") == 2, log[-3000:]
    assert "Resumed from:" in log.split(" train --config ")[-1], log[-3000:]

    # Exactly one row of out-of-fold probabilities per training row, from the fold that held it out.
    record = json.loads((out / "audit.json").read_text())
    oof = [json.loads(line) for line in (out / "out_of_fold.jsonl").read_text().splitlines()]
    assert [r["id"] for r in oof] == list(range(800)) and [r["fold"] for r in oof] == record["fold_of"]
    assert sorted(record["fold_of"]).count(0) == 400
    assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-4 for r in oof)

    issues = list(csv.DictReader((out / "label_issues.csv").open()))
    flagged = [int(r["id"]) for r in issues]
    planted = [i for i in flagged if i in PLANTED]
    assert len(planted) >= 8 and len(planted) >= 0.75 * len(flagged), issues
    assert all(i in PLANTED for i in flagged[:6]), issues  # the most suspect first
    names = ["World", "Sports", "Business", "Sci/Tech"]
    for r in issues:
        i = int(r["id"])
        assert r["where"] == f"{data / 'train.csv'}:{i + 1}" and r["given"] == names[int(rows[i][0]) - 1]
        if i in PLANTED:  # the label it had before it was flipped
            assert r["suggested"] == names[i % 4]
    assert "all            800" in again.stdout and "train without the flagged rows:" in again.stdout
    kept = [json.loads(line)["id"] for line in (out / "clean-drop" / "train.jsonl").read_text().splitlines()]
    assert sorted(kept) == sorted(set(range(800)) - set(flagged))

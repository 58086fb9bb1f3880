"""`distrinews train` with no data directory takes AG News from the hub, here a stand-in for it.

A fake ``datasets`` package on ``PYTHONPATH`` (inherited by the torchrun workers) answers
``load_dataset("fancyzhx/ag_news", split=...)`` with the real rows of the shared copy in the
hub's schema, so the whole path runs: the launcher's preflight reads both splits, then the
workers read them again, tokenize and train.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FAKE_DATASETS = """
import json, os

class _Split:
    def __init__(self, columns):
        self.columns, self.column_names = columns, list(columns)

    def __getitem__(self, name):
        return self.columns[name]

def load_dataset(name, split=None, **kwargs):
    assert name == "fancyzhx/ag_news", name
    with open(os.path.join(os.environ["FAKE_HUB_DIR"], split + ".json")) as fh:
        return _Split(json.load(fh))
"""


def _hub_split(path: Path, rows: int) -> dict[str, list]:
    """The first ``rows`` of the original CSV as the hub has them: title + " " + description, raw; labels 0-3."""
    import csv
    import gzip
    import io

    found = list(csv.reader(io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")))[:rows]
    return {
        "text": [f"{title} {description}" for _, title, description in found],
        "label": [int(c) - 1 for c, _, _ in found],
    }


def test_train_without_data_dir_uses_the_hub(tmp_path, cli, configs_dir, agnews_dir):
    package = tmp_path / "fake" / "datasets"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_DATASETS)
    hub = tmp_path / "hub"
    hub.mkdir()
    # 1,000 test rows, not the local copy's 7,600: what the run evaluates on shows where its data came from.
    for split in ("train", "test"):
        (hub / f"{split}.json").write_text(json.dumps(_hub_split(agnews_dir / f"{split}.csv.gz", 1000)))
    run = tmp_path / "run"
    env = {
        "DISTRINEWS_DATA": "",
        "FAKE_HUB_DIR": str(hub),
        "PYTHONPATH": os.pathsep.join(p for p in (str(package.parent), os.environ.get("PYTHONPATH", "")) if p),
    }
    args = ("train", "--config", str(configs_dir / "tiny.yaml"), "--output-dir", str(run), "--max_steps", "4")
    proc = cli(*args, "--train_samples", "64", "--eval_samples", "null", nproc=2, env=env, timeout=300)
    assert "Test samples:         1,000" in proc.stdout, proc.stdout[-3000:]
    info = json.loads((run / "best" / "distrinews.json").read_text())
    assert info["metrics"]["samples"] == 1000

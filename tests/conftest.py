"""Shared test setup: offline hub, the shared AG News copy, a private token cache, and a CLI runner."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
SHARED_DATA = Path(os.environ.get("DISTRINEWS_DATA") or ROOT.parent / "shared" / "data" / "ag_news")

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("PYTHONUNBUFFERED", "1")


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    os.environ["DISTRINEWS_CACHE"] = str(tmp_path_factory.mktemp("token-cache"))
    os.environ.pop("DISTRINEWS_DATA", None) if not SHARED_DATA.is_dir() else os.environ.__setitem__("DISTRINEWS_DATA", str(SHARED_DATA))


@pytest.fixture(scope="session")
def agnews_dir() -> Path:
    """The real AG News copy beside the checkout (../shared/data/ag_news)."""
    if not (SHARED_DATA / "test.csv.gz").is_file():
        pytest.skip(f"AG News not found at {SHARED_DATA}; set DISTRINEWS_DATA")
    return SHARED_DATA


def write_csv(path: Path, rows: list[tuple], gz: bool = False) -> Path:
    import csv
    import io

    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    data = buf.getvalue().encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def run_cli(*args: str, nproc: int | None = None, timeout: float = 600, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m distrinews ARGS`` (with ``--nproc-per-node`` when nproc is given), output captured."""
    cmd = [sys.executable, "-m", "distrinews", *args]
    if nproc is not None:
        cmd += ["--nproc-per-node", str(nproc)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}")
    return proc

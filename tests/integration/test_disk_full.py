"""A disk that fills up while the run saves, for real: the output directory is a tmpfs mounted by the
test, sized so that the first saves fit and a later one does not. The run must end in one line that
says where, how much is needed and free, and what to resume from, with nothing half-written left."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import QUIET, TINY, unavailable
from distrinews.checkpoint.manifest import list_checkpoints, resolve_resume, verify_checkpoint
from distrinews.data.rows import AG_NEWS_LABELS

# 2 ranks x 16 rows of the tiny preset's 400: 13 steps an epoch, so no evaluation before step 6 unless asked.
ARGS = (
    *TINY,
    "--bf16",
    "false",
    *QUIET,
    "--eval_samples",
    "64",
    "--max_steps",
    "6",
    "--save_steps",
    "1",
    "--save_total_limit",
    "null",
)
UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@contextlib.contextmanager
def _small_disk(path: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``path`` for the block."""
    if os.geteuid() != 0:
        unavailable("mounting a tmpfs needs root")
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size // 1024}k", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        unavailable(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture(scope="module")
def weights_bytes() -> int:
    """The tiny model's weights; a resumable checkpoint is about three times that (weights, AdamW's two moments)."""
    from distrinews.model import build_model

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _bytes(number: str, unit: str) -> float:
    return float(number) * UNITS[unit]


@pytest.mark.parametrize(
    "full_at",
    [
        # step-1 and step-2 fit; step-3's weights fit, its optimizer state (twice as large) does not:
        # torch's zip writer fails mid-file ("unexpected pos").
        "checkpoint",
        # step-1 fits with half the weights' size to spare; the best model of the evaluation at step 2
        # does not (safetensors' "No space left on device (os error 28)").
        "best",
    ],
)
def test_a_full_disk_ends_the_run_in_one_line_and_leaves_the_newest_checkpoint_resumable(
    tmp_path, cli, agnews_dir, weights_bytes, full_at
):
    checkpoint = 3 * weights_bytes
    if full_at == "checkpoint":
        size, extra, newest_step = 2 * checkpoint + 2 * weights_bytes, (), 2
    else:
        size, extra, newest_step = checkpoint + weights_bytes // 2, ("--eval_steps", "2"), 1
    with _small_disk(tmp_path / "disk", size) as disk:
        run = disk / "run"
        failed = cli("train", *ARGS, *extra, "--output-dir", str(run), nproc=2, check=False, timeout=300)
        output = failed.stdout + failed.stderr

        assert failed.returncode == 2, output[-4000:]
        assert "Traceback" not in output and "inline_container" not in output, output[-4000:]
        lines = failed.stderr.strip().splitlines()
        assert len(lines) == 1, failed.stderr
        line = lines[0]
        target = run / "best" if full_at == "best" else run / "checkpoints" / f"step-{newest_step + 1}"
        newest = run / "checkpoints" / f"step-{newest_step}"
        assert line.startswith(f"distrinews: error: no space left to save {target}: "), line
        assert f"the filesystem mounted at {disk} (tmpfs)" in line, line
        assert (
            f"the newest complete checkpoint is {newest}: free some space, then continue with --resume auto" in line
        ), line
        free = re.search(r"has ([\d.]+) (bytes|KiB|MiB|GiB) free", line)
        needed = re.search(r"the save needs (?:about|at least) ([\d.]+) (bytes|KiB|MiB|GiB)", line)
        assert free and needed, line
        assert _bytes(*free.groups()) < _bytes(*needed.groups()) <= size, line

        leftovers = [
            p for d in (run, run / "checkpoints") for p in d.iterdir() if p.name.startswith((".tmp-", ".old-"))
        ]
        assert not leftovers, leftovers
        assert [p.name for p in list_checkpoints(run / "checkpoints")] == [
            f"step-{s}" for s in range(1, newest_step + 1)
        ]
        verify_checkpoint(newest)
        assert resolve_resume("auto", run / "checkpoints") == newest

        if full_at == "checkpoint":  # room made: the run continues from the newest checkpoint to the end
            subprocess.run(["mount", "-o", f"remount,size={4 * size // 1024}k", str(disk)], check=True)
            resumed = cli("train", *ARGS, "--output-dir", str(run), "--resume", "auto", nproc=2, timeout=300)
            assert "Resumed from:" in resumed.stdout and f"(step {newest_step})" in resumed.stdout
            verify_checkpoint(run / "checkpoints" / "step-6")
            assert (run / "best" / "model.safetensors").is_file()

"""The comparison tools (``benchmarks/tools``) run from the repository's root as ``python -m benchmarks.tools.NAME``.

Timings are never asserted: only that the tools ran and that their figures agree with their own arithmetic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("compare", "baseline", "precision", "replicas", "serving_reference", "serving_stages", "hf_trainer",
         "lightning_trainer", "accelerate_loop", "reference_loop", "fault_overhead", "calibrate_existing",
         "calibration_rows", "tuning_split", "study_summary")  # fmt: skip


def tool(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.tools.{name}", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def test_every_tool_answers_help_as_python_dash_m():
    """One process runs each tool's ``__main__`` with ``--help`` (each tool's own process would cost its imports
    again)."""
    script = (
        "import runpy, sys, warnings\n"
        "warnings.simplefilter('ignore', RuntimeWarning)\n"  # a tool another one imported is in sys.modules already
        "for name in sys.argv[1:]:\n"
        "    sys.argv = [name, '--help']\n"
        "    try:\n"
        "        runpy.run_module(f'benchmarks.tools.{name}', run_name='__main__')\n"
        "    except SystemExit as exc:\n"
        "        print(f'{name} exit {exc.code}', file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, *TOOLS], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.stderr.splitlines()[-len(TOOLS) :] == [f"{name} exit 0" for name in TOOLS], proc.stderr[-3000:]
    for name in ("compare", "baseline", "precision", "replicas", "serving_reference", "serving_stages"):
        assert f"usage: python -m benchmarks.tools.{name}" in proc.stdout


def test_ours_against_the_reference_server_reports_both_and_the_ratios(tmp_path, agnews_dir, spread_checkpoint):
    checkpoint = spread_checkpoint(
        tmp_path / "ckpt", ["Oil prices jump", "Chelsea beat Arsenal", "Apple unveils a chip", "Rates rise"]
    )
    out = tmp_path / "bench"
    args = ["--checkpoint", str(checkpoint), "--data", str(agnews_dir), "--runtimes", "torch", "--texts", "50"]
    load = ["--concurrency", "1,2", "--duration", "0.3", "--warmup", "0.1", "--overload-queue", "0"]
    tool("serving_reference", *args, *load, "--output-dir", str(out))
    report = json.loads((out / "serving-vs-reference.json").read_text())
    rows = {(r["server"], r["runtime"], r["texts"], r["concurrency"]): r for r in report["results"]}
    assert set(rows) == {
        (s, "torch", t, c) for s in ("reference", "ours") for t, c in (("full", 1), ("full", 2), ("headline", 1))
    } | {("empty", "-", "full", 1), ("empty", "-", "full", 2)}
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in rows.values()), rows
    ratio = next(x for x in report["ratios_vs_reference"] if x["concurrency"] == 2)
    ours, ref = rows["ours", "torch", "full", 2], rows["reference", "torch", "full", 2]
    assert ratio["throughput_ratio"] == pytest.approx(ours["throughput_rps"] / ref["throughput_rps"], rel=1e-3)
    assert report["limit"]["seed_ratio"] == ratio["throughput_ratio"]  # the aim against the seed-style server
    assert report["limit"]["aims"][-1]["aim"] == "at 2 clients at least 8x the seed-style server"
    assert report["command"].startswith("python -m benchmarks.tools.serving_reference --checkpoint")
    md = (out / "serving-vs-reference.md").read_text()
    assert "| CPU server | CPU clients |" in md and "## Ours vs the reference server" in md


def test_compare_trains_lightning_and_accelerate_side_by_side_and_reads_their_step_times(tmp_path, news_corpus):
    """Both peers under torchrun, 2 processes over gloo, the tiny model: 48 rows, 4 a process, so 6 steps each,
    their step times read back into the steady and whole-loop rates, scored on the same 16 test rows."""
    require("lightning")
    require("accelerate")
    out = tmp_path / "bench"
    sizes = ["--train-samples", "48", "--eval-samples", "16", "--batch-size", "4", "--max-length", "32"]
    tool("compare", "--what", "compare", "--runs", "lightning,accelerate", "--model", "tiny-random",
         "--data", str(news_corpus), *sizes, "--warmup-step", "2", "--nproc", "2", "--timeout", "240",
         "--output-dir", str(out), "--name", "peers")  # fmt: skip
    report = json.loads((out / "peers.json").read_text())
    rows = {r["key"]: r for r in report["compare"]["rows"]}
    assert list(rows) == ["lightning", "accelerate"]
    for r in rows.values():
        assert (r["steps"], r["global_batch"], r["test_samples"]) == (6, 8, 16), r
        assert r["steady_samples_per_s"] > 0 and r["loop_samples_per_s"] == pytest.approx(6 * 8 / r["loop_time_s"])
        assert 0 <= r["test_accuracy"] <= 1 and r["train_loss"] > 0
    md = (out / "peers.md").read_text()
    assert "| PyTorch Lightning Trainer | 42 | 6 |" in md and "| Accelerate loop | 42 | 6 |" in md
    assert (out / "peers.png").stat().st_size > 0

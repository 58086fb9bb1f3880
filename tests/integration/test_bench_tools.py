"""The benchmark commands run end to end (tiny model, few steps, small messages) and report consistent figures.

Timings are never asserted: only that the tools ran, wrote their files, and that their figures
agree with their own arithmetic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import STATED_PEAK
from distrinews.data.rows import AG_NEWS_LABELS

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# MFU against a stated peak, not one measured on whatever CPU runs the suite (AVX2, AVX-512 BF16, AMX differ
# tenfold). The tiny model trains at about 0.4 GFLOP/s on a loaded 2-core Xeon (MFU 8e-3 against the 50 GFLOP/s
# of conftest.STATED_PEAK): more than a hundred times below it on any CPU, yet an MFU off by a factor of 1,000
# lands above 1.


def test_bench_help_lists_every_tool(cli):
    out = cli("bench", "--help").stdout
    for tool in ("scaling", "collectives", "serving", "batch", "profile"):
        assert tool in out


def test_the_commands_that_start_workers_check_the_data_first_in_one_line(tmp_path):
    """Without --data or $DISTRINEWS_DATA (and no hub), each says so in one line, exit 2, before any worker starts
    (no worker's traceback, no torchrun report)."""
    env = {k: v for k, v in os.environ.items() if k != "DISTRINEWS_DATA"} | {"HF_HUB_OFFLINE": "1"}
    for command in (["scaling", "--nproc", "1,2"], ["collectives", "--nproc", "2", "--model", "tiny-random"]):
        proc = subprocess.run([sys.executable, "-m", "distrinews", "bench", *command, "--output-dir", str(tmp_path)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr[-3000:]
        assert proc.stderr.startswith("distrinews: error: no data directory given") and "--data DIR" in proc.stderr


def test_scaling_weak_1_and_2_workers(tmp_path, agnews_dir, cli):
    cli(
        "bench",
        "scaling",
        "--nproc",
        "1,2",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--no-sync-probe",
        "1",
        "--config",
        str(CONFIGS / "tiny.yaml"),
        "--train_samples",
        "96",
        "--max_length",
        "32",
        "--comm-hooks",
        "bf16,auto",
        "--output-dir",
        str(tmp_path),
        "--name",
        "weak",
        env=STATED_PEAK,
    )
    report = json.loads((tmp_path / "weak.json").read_text())
    assert (tmp_path / "weak.md").read_text().count("| 1 x 1 |") == 1
    assert (tmp_path / "weak.png").stat().st_size > 1000
    assert [(p["workers"], p["ddp_comm_hook"]) for p in report["points"]] == [(1, None), (2, "bf16"), (2, "auto")]
    one, two, shm = report["points"]
    assert (
        shm["allreduce"].startswith("shared memory, ") and "100 (shared memory)" in (tmp_path / "weak.md").read_text()
    )
    assert shm["efficiency"] == pytest.approx(shm["samples_per_s"] / one["samples_per_s"] / 2)
    assert one["speedup"] == pytest.approx(1.0) and one["efficiency"] == pytest.approx(1.0)
    assert two["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    # weak scaling: per-worker batch fixed, global batch doubles; 2 steps x global batch rows were timed
    assert one["per_worker_batch"] == two["per_worker_batch"] == 16 and two["global_batch"] == 32
    assert sum(r["samples"] for r in two["ranks"]) == 2 * 32
    assert two["samples_per_s"] == pytest.approx(64 / two["elapsed_s"])
    # each worker pinned to its own core, one thread
    cores = [tuple(r["cores"]) for r in two["ranks"]]
    assert len(set(cores)) == 2 and all(len(c) == 1 for c in cores) and all(r["threads"] == 1 for r in two["ranks"])
    assert set(two["phases_ms"]) == {"data", "forward_backward", "optimizer"}
    assert two["exposed_allreduce_ms"] == pytest.approx(two["fwd_bwd_sync_ms"] - two["fwd_bwd_no_sync_ms"])
    assert one["exposed_allreduce_ms"] is None and one["bucket_cap_mb"] is None
    assert two["ddp_comm_hook"] == "bf16" and "100 (gloo, bf16-compressed)" in (tmp_path / "weak.md").read_text()
    assert 0 < two["mfu"] < 1


def test_collectives_table_and_model_section(tmp_path, agnews_dir, cli):
    cli(
        "bench",
        "collectives",
        "--nproc",
        "2",
        "--max-bytes",
        "4096",
        "--model",
        "tiny-random",
        "--train-samples",
        "64",
        "--compute-batches",
        "1",
        "--max-length",
        "32",
        "--output-dir",
        str(tmp_path),
        "--name",
        "coll",
    )
    report = json.loads((tmp_path / "coll.json").read_text())
    assert report["backend"] == "gloo" and report["world_size"] == 2
    # nccl-tests' bus bandwidth factors at n = 2 ranks (PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather and
    # reduce-scatter (n-1)/n, broadcast 1. Written out, not taken from the code under test.
    bus_factor = {"all_reduce": 1.0, "all_gather": 0.5, "broadcast": 1.0, "reduce_scatter": 0.5}
    assert report["checks"] == dict.fromkeys(bus_factor, True)
    for op, factor in bus_factor.items():
        rows = [r for r in report["table"] if r["op"] == op]
        assert [r["bytes"] for r in rows] == [1024, 2048, 4096]
        for r in rows:
            assert r["algbw"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6))
            assert r["busbw"] == pytest.approx(r["algbw"] * factor)
    model = report["model"]
    from distrinews.model import build_model

    params = sum(p.numel() for p in build_model("tiny-random", labels=AG_NEWS_LABELS, seed=0).parameters())
    assert model["gradient_bytes"] == 4 * params and model["parameters"] == params
    assert model["measured_ratio"] == pytest.approx(model["allreduce_s"] / model["forward_backward_s"])
    # Lesson 04's estimate as written there: 4-byte parameters, all-reduced (2(n-1)/n of them at n = 2) at
    # 100 GB/s, against 6 x bytes x batch 16 x 512 tokens "FLOPs" at 100 TFLOP/s; the ratio is 1e3 / (6 x 16 x 512).
    lesson = {"comm_s": 4 * params / 100e9, "comp_s": 6 * 4 * params * 16 * 512 / 100e12, "ratio": 1e3 / (6 * 16 * 512)}
    assert model["lesson_estimate"] == pytest.approx(lesson)
    md = (tmp_path / "coll.md").read_text()
    assert "measured comm/compute ratio" in md and "lesson 04's estimate" in md
    assert (tmp_path / "coll.png").stat().st_size > 1000


def test_training_log_carries_speed_and_mfu(tmp_path, agnews_dir, monkeypatch):
    from distrinews.config import load_config
    from distrinews.train import flops
    from distrinews.train.trainer import train

    monkeypatch.setenv(flops.PEAK_ENV, STATED_PEAK[flops.PEAK_ENV])
    flops.device_peak.cache_clear()

    config = load_config(
        CONFIGS / "tiny.yaml",
        {
            "train_samples": 64,
            "eval_samples": 32,
            "max_steps": 4,
            "logging_steps": 2,
            "max_length": 32,
            "output_dir": str(tmp_path / "run"),
            "report_to": ["none"],
            "disable_tqdm": True,
        },
    )
    try:
        train(config)
    finally:
        flops.device_peak.cache_clear()  # the next caller measures its own peak again
    records = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    logged = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in logged] == [2, 4]
    for r in [*logged, next(r for r in records if r["kind"] == "epoch")]:
        assert r["samples_per_s"] > 0 and r["tokens_per_s"] > r["samples_per_s"] and 0 < r["mfu"] < 1


def test_serving_reports_load_and_cpu_of_your_server_and_its_overload(tmp_path, agnews_dir, spread_checkpoint, cli):
    checkpoint = spread_checkpoint(
        tmp_path / "ckpt", ["Oil prices jump", "Chelsea beat Arsenal", "Apple unveils a chip", "Rates rise"]
    )
    out = tmp_path / "bench"
    args = ["--checkpoint", str(checkpoint), "--data", str(agnews_dir), "--runtimes", "torch", "--texts", "50"]
    load = ["--concurrency", "1,2", "--duration", "0.3", "--warmup", "0.1", "--overload-queue", "0"]
    cli("bench", "serving", *args, *load, "--output-dir", str(out))
    report = json.loads((out / "serving.json").read_text())
    rows = {(r["server"], r["runtime"], r["texts"], r["concurrency"]): r for r in report["results"]}
    ours = {("ours", "torch", t, c) for t, c in (("full", 1), ("full", 2), ("headline", 1))}
    assert set(rows) == ours | {("empty", "-", "full", 1), ("empty", "-", "full", 2)}  # the empty responder's floor
    for r in rows.values():
        assert r["requests"] > 0 and r["errors"] == 0
        assert r["throughput_rps"] == pytest.approx(r["requests"] / r["duration_s"])
        assert (
            0 < r["server_cpu_cores"] <= 4 and 0 < r["client_cpu_cores"] <= 4
        )  # cores the server and the clients used
    assert report["command"].startswith("distrinews bench serving --checkpoint")
    limit = report["limit"]  # the runtime alone, in this process, at the batch sizes the server forms (32, 512 tokens)
    alone = limit["runtime_alone"]
    assert alone["runtime"] == "torch" and alone["requests"] > 0 and set(alone["texts_per_s"]) == {"1", "8", "16", "32"}
    assert alone["best_texts_per_s"] == max(alone["texts_per_s"].values()) and alone["max_batch_tokens"] == 512
    assert alone["in_flight"] == 2  # batches from no more texts than the busiest level's 2 clients keep in flight
    assert limit["overhead_ms"] == pytest.approx(
        rows["ours", "torch", "full", 1]["p50_ms"] - alone["p50_ms"] - rows["empty", "-", "full", 1]["p50_ms"]
    )
    assert [a["passed"] in (True, False) for a in limit["aims"]] == [True, True]
    assert (
        "## The limit (torch)" in (out / "serving.md").read_text()
        and "from at most 2 texts at a time (what 2 clients keep in flight)" in (out / "serving.md").read_text()
        and "| CPU server | CPU clients |" in (out / "serving.md").read_text()
        and (out / "serving.png").stat().st_size > 1000
    )


def test_batch_times_the_engines_against_the_server_loop_and_a_resume(tmp_path, agnews_dir, spread_checkpoint, cli):
    checkpoint = spread_checkpoint(
        tmp_path / "ckpt", ["Oil prices jump", "Chelsea beat Arsenal", "Apple unveils a chip", "Rates rise"]
    )
    out = tmp_path / "bench"
    args = [
        "--checkpoint",
        str(checkpoint),
        "--data",
        str(agnews_dir),
        "--rows",
        "600",
        "--nproc",
        "2",
        "--ray-actors",
        "0",
    ]
    # Killed once 30 of the 600 rows are committed: after a worker's first pass (of about 30 texts here), with
    # some 9 passes a worker still to go, so the kill lands mid-run however slow the machine is.
    cli("bench", "batch", *args, "--rss-rows", "", "--kill-at", "0.05", "--runtime", "onnx", "--output-dir", str(out))
    report = json.loads((out / "batch.json").read_text())
    engines = {r["engine"]: r for r in report["results"]}
    assert set(engines) == {"predict --nproc 2", "serve + a loop posting 64"}  # the memory runs are the same record
    for r in engines.values():
        assert r["exit"] == 0 and r["labelled"] == r["rows"] and r["peak_rss_mib"] > 50
        assert r["rows_per_s"] == pytest.approx(r["rows"] / r["seconds"])
    resume = report["resume"]
    assert resume["labelled"] == 600 and resume["exit"] == 0
    # A resume: the killed run left rows committed, not all of them, and the second run took over exactly those
    assert 30 <= resume["rows_done_at_kill"] < 600, resume
    assert resume["rows_continued"] == resume["rows_done_at_kill"], resume
    assert resume["total_s"] == pytest.approx(resume["killed_after_s"] + resume["resumed_s"])
    table = (out / "batch.md").read_text()
    assert "| predict --nproc 2 | 600 |" in table and "Resume: `predict --nproc 2` SIGKILLed" in table


def test_profile_groups_a_steps_operator_time(tmp_path, agnews_dir, cli):
    out = tmp_path / "bench"
    tiny = ["--config", str(CONFIGS / "tiny.yaml"), "--warmup", "1", "--steps", "2", "--profiled-steps", "2"]
    cli("bench", "profile", *tiny, "--per_device_train_batch_size", "8", "--output-dir", str(out))
    report = json.loads((out / "profile.json").read_text())
    assert report["step_ms"] > 0 and report["samples_per_s"] == pytest.approx(8 / (report["step_ms"] / 1000))
    assert sum(report["groups"].values()) == pytest.approx(report["profiled_ms_per_step"])
    assert sum(o["self_ms"] for o in report["operators"]) == pytest.approx(report["profiled_ms_per_step"])
    assert report["groups"]["matrix products"] > 0 and "| matrix products |" in (out / "profile.md").read_text()

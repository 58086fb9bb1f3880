"""The peer benchmark end to end at CI size: ours against LitServe (the peer the main environment has, through the
``lab`` extra), one round, 1 and 2 clients for 2 s each, on the tiny model. Speed is never asserted: only that both
servers answered every request, and that the JSON, the table and the plot were written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import require

pytestmark = pytest.mark.slow


def test_ours_and_litserve_are_measured_side_by_side(tmp_path, agnews_dir, spread_checkpoint, repo_root):
    require("litserve", "the peer benchmark's test runs LitServe (pip install -e '.[lab]')")
    checkpoint = spread_checkpoint(tmp_path / "ckpt", ["Oil prices jump", "Chelsea beat Arsenal", "A new chip"])
    out = tmp_path / "peers"
    command = [sys.executable, "-m", "benchmarks.tools.peers", "run", "--checkpoint", str(checkpoint)]
    command += ["--data", str(agnews_dir), "--texts", "50", "--peers", "ours,litserve", "--clients", "1,2"]
    command += ["--duration", "2", "--warmup", "0.5", "--rounds", "1", "--python", sys.executable]
    command += ["--lock", str(tmp_path / "bench.lock"), "--output-dir", str(out)]  # not the machine's lock: CI
    done = subprocess.run(command, cwd=repo_root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((out / "peers.json").read_text())
    rows = {(r["server"], r["concurrency"]): r for r in report["summary"]}
    assert set(rows) == {("ours", 1), ("ours", 2), ("litserve", 1), ("litserve", 2)}
    for r in rows.values():
        assert r["errors"] == 0 and r["rejected_429"] == 0 and r["requests"] > 0 and r["throughput_rps"] > 0
        assert r["cpu_ms_per_request"] > 0  # the servers' process trees were measured
    assert {q["peer"] for q in report["ours_vs_peers"]} == {"litserve"}
    assert report["served"]["litserve"]["model"]["runtime"] == report["served"]["ours"]["model"]["runtime"]
    assert report["served"]["litserve"]["config"]["LitAPI"]["max_batch_size"] == 32  # ours' default, passed on
    table = (out / "peers.md").read_text()
    assert "| litserve | 2 |" in table and "| ours | 1 |" in table and "litserve " in table
    assert (out / "peers.png").stat().st_size > 1000

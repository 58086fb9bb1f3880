"""A published ``step-N`` is never written again: served, predicted and exported with every default, it is byte for
byte what training wrote, and ``--resume auto`` still continues from it (issue 45, finding 2: the default runtime
used to write ``model.int8.onnx`` into it, which its manifest then refused)."""

from __future__ import annotations

import hashlib
import shutil

import httpx


def _hashes(folder) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_a_step_served_predicted_and_exported_with_the_defaults_stays_whole_and_resumes(
    thirty_steps, tmp_path, cli, server_process
):
    args, uninterrupted = thirty_steps
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.yaml", "log.jsonl"):
        shutil.copy2(uninterrupted / name, run / name)
    step = shutil.copytree(uninterrupted / "checkpoints" / "step-25", run / "checkpoints" / "step-25")
    before = _hashes(step)

    with server_process(step, tmp_path / "serve.log") as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/predict", json={"text": "Stocks rally as oil falls"}).status_code == 200
            assert client.get("/info").json()["runtime_choice"]["requested"] == "auto"
    cli("predict", "--checkpoint", str(step), "Stocks rally as oil falls")
    exported = cli("export", "--checkpoint", str(step), "--format", "onnx").stdout
    assert str(step) not in exported.split("wrote ", 1)[1], exported
    assert _hashes(step) == before, "every file of the step byte for byte, and no other"

    out = cli("train", *args, "--output-dir", str(run), "--resume", "auto", nproc=2).stdout
    assert f"Resumed from:         {step} (step 25)" in out and "skipping" not in out, out

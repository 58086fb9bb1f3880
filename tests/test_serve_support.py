"""Helpers for the serving tests (no tests here): a servable tiny checkpoint and a real server process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]


def build_spread_checkpoint(path: Path, calibration_texts: list[str]) -> Path:
    """A tiny random BERT whose predictions actually depend on the text.

    The stock tiny model (init std 0.02) maps every text to nearly the same logits, so
    "same labels" would hold trivially. Larger random weights make the pooled features
    vary with the input; a head whitened on a few real texts spreads them over all four
    labels, with confidences from ~0.3 to ~0.99. Deterministic, and built in seconds.
    """
    from distrinews.checkpoint import save_servable
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", dropout=0.0, seed=0).eval()
    tokenizer = build_tokenizer("tiny-random")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, 1.5 / module.in_features**0.5, generator=g)
                module.bias.normal_(0, 0.5, generator=g)
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0, 1.0, generator=g)
        enc = tokenizer(calibration_texts, truncation=True, max_length=64, padding=True, return_tensors="pt")
        pooled = model.bert(**enc).pooler_output
        mean, std = pooled.mean(0), pooled.std(0) + 1e-6
        weight = torch.randn(model.config.num_labels, pooled.shape[1], generator=g) / std / pooled.shape[1] ** 0.5 * 2
        model.classifier.weight.copy_(weight)
        model.classifier.bias.copy_(-(weight @ mean))
    return save_servable(path, model, tokenizer, {"max_length": 64, "model_name": "tiny-random-spread"})


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m distrinews serve`` on a free loopback port, output in a log file."""

    def __init__(self, checkpoint: Path, log_path: Path, *args: str, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "distrinews", "serve", "--checkpoint", str(checkpoint), "--host", "127.0.0.1", "--port", str(self.port), *args]
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} before it was ready:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {timeout}s:\n{self.log()}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

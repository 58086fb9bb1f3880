"""Checkpoint files are readable by other users (a container's non-root server, for one)."""

import os
import stat

import pytest

from distrinews.checkpoint.records import ServableInfo
from distrinews.checkpoint.servable import save_servable
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model, build_tokenizer


@pytest.fixture
def default_umask():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_servable_files_get_plain_modes(tmp_path, default_umask):
    model, tok = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0), build_tokenizer("tiny-random")
    best = save_servable(tmp_path / "best", model, model.state_dict(), tok, ServableInfo(max_length=64))
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in best.iterdir()}
    assert "model.safetensors" in modes
    assert modes == {name: 0o644 for name in modes}, {n: oct(m) for n, m in modes.items()}

"""A checkpoint's JSON files (``config.json``, ``distrinews.json``) are read at most ``JSON_LIMIT`` bytes and never
through a symbolic link, at every entry point that loads a checkpoint: ``Classifier``, ``distrinews predict`` and a
server built by the app factory, on PyTorch and on the slim ONNX path (which reads them without transformers).

Each planted file is valid JSON that a reader without the checks would load as it is: only the checks refuse it.
"""

from __future__ import annotations

import asyncio
import html
import logging
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import served
from distrinews.checkpoint.records import JSON_LIMIT, SERVABLE_INFO, ServableInfo
from distrinews.errors import CheckpointError

LABELS = ["business", "sport", "tech"]
WHY = {
    "oversized": f"over {JSON_LIMIT >> 20} MiB (refused, not read)",
    "symlink": "a symbolic link (refused, not followed)",
}


@pytest.fixture(scope="module")
def best(tmp_path_factory) -> Path:
    """A servable folder with an ONNX file beside it, so ``--runtime onnx`` takes the slim path: the file is not a
    graph, and the session that would read it is made only after the checkpoint's JSON files are read."""
    from distrinews.checkpoint.servable import save_servable
    from distrinews.model import build_model, build_tokenizer

    model = build_model("tiny-random", labels=LABELS, dropout=0.0, seed=0).eval()
    best = save_servable(
        tmp_path_factory.mktemp("reads") / "best",
        model,
        model.state_dict(),
        build_tokenizer("tiny-random"),
        ServableInfo(label_names=LABELS, max_length=32),
    )
    (best / "model.onnx").write_bytes(b"not an ONNX graph")
    return best


def _planted(best: Path, into: Path, name: str, how: str) -> Path:
    checkpoint = into / "best"
    shutil.copytree(best, checkpoint)
    target = checkpoint / name
    text = target.read_text()
    if how == "oversized":  # trailing blanks: still valid JSON, one byte over the limit
        target.write_text(text + " " * (JSON_LIMIT + 1 - len(text.encode())))
    else:  # the same content, through a link the save did not make
        elsewhere = into / f"elsewhere-{name}"
        elsewhere.write_text(text)
        target.unlink()
        target.symlink_to(elsewhere)
    return checkpoint


def _serve(checkpoint: Path, runtime: str) -> tuple[httpx.Response, httpx.Response]:
    from distrinews.serve.app import ServeConfig, create_app

    app = create_app(ServeConfig(checkpoint=str(checkpoint), api_key="", runtime=runtime))

    async def main():
        async with served(app, ready=False) as client:
            for _ in range(2000):
                health = await client.get("/health")
                if health.status_code == 503:
                    break
                await asyncio.sleep(0.01)
            return health, await client.get("/")

    return asyncio.run(main())


@pytest.mark.parametrize("how", ["oversized", "symlink"])
@pytest.mark.parametrize("name", ["config.json", SERVABLE_INFO])
def test_an_oversized_or_linked_json_file_is_refused_in_one_line_at_every_entry_point(
    best, tmp_path, capsys, caplog, name, how
):
    from distrinews import Classifier
    from distrinews.cli import main

    checkpoint = _planted(best, tmp_path, name, how)
    expected = f"could not load checkpoint {checkpoint / name}: {WHY[how]}"
    for runtime in ("torch", "onnx"):
        with pytest.raises(CheckpointError) as refused:
            Classifier.load(checkpoint, runtime)
        assert str(refused.value) == expected, runtime

        capsys.readouterr()
        assert main(["predict", "--checkpoint", str(checkpoint), "--runtime", runtime, "Oil prices jump"]) == 2
        assert capsys.readouterr().err == f"distrinews: error: {expected}\n", runtime

        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="distrinews.serve"):
            health, page = _serve(checkpoint, runtime)
        assert health.status_code == 503, (runtime, health.text)
        assert health.json()["error"] == "the model failed to load (the server log says why)"
        # the page still answers before (and without) a model: with the labels config.json gives, if it is read
        shown = "Labels: the model's" if name == "config.json" else "Labels: business, sport or tech."
        assert page.status_code == 200 and html.escape(shown) in page.text, page.text
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [expected], runtime

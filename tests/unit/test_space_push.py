"""`export --format space --push-to-hub REPO_ID`, with the Hub client replaced (this machine has no hub)."""

from __future__ import annotations

from typing import ClassVar

import pytest

from conftest import require
from distrinews.checkpoint.records import ServableInfo
from distrinews.checkpoint.servable import save_servable
from distrinews.cli import main
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model, build_tokenizer

huggingface_hub = require("huggingface_hub")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model, tokenizer = (
        build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval(),
        build_tokenizer("tiny-random"),
    )
    return save_servable(
        tmp_path_factory.mktemp("ckpt") / "best",
        model,
        model.state_dict(),
        tokenizer,
        ServableInfo(model_name="tiny-random"),
    )


class FakeApi:
    """Records what HfApi was asked; ``fail`` makes the upload raise like a network error."""

    calls: ClassVar[list] = []
    fail: ClassVar[Exception | None] = None

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/spaces/{repo_id}"

    def upload_folder(self, **kwargs):
        if self.fail is not None:
            raise self.fail
        self.calls.append(("upload_folder", kwargs))


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    FakeApi.calls, FakeApi.fail = [], None
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_test_token")
    return FakeApi


def export(checkpoint, out, *extra):
    return main(
        [
            "export",
            "--checkpoint",
            str(checkpoint),
            "--format",
            "space",
            "--runtime",
            "torch",
            "--output",
            str(out),
            *extra,
        ]
    )


def test_push_creates_a_docker_space_and_uploads_the_folder(checkpoint, tmp_path, hub, capsys):
    assert export(checkpoint, tmp_path / "space", "--push-to-hub", "me/distrinews", "--version", "1.1.0") == 0
    assert hub.calls[0] == ("init", "hf_test_token")
    assert hub.calls[1] == (
        "create_repo",
        "me/distrinews",
        {"repo_type": "space", "space_sdk": "docker", "exist_ok": True, "private": False},
    )
    (_, upload) = hub.calls[2]
    assert upload["repo_id"] == "me/distrinews" and upload["repo_type"] == "space"
    assert upload["folder_path"] == str(tmp_path / "space") and ".git/*" in upload["ignore_patterns"]
    assert upload["commit_message"] == "DistriNews v1.1.0 (torch)"
    assert "pushed to https://huggingface.co/spaces/me/distrinews" in capsys.readouterr().out
    assert "https://me-distrinews.hf.space/predict" in (tmp_path / "space" / "README.md").read_text()


def test_no_token_is_one_line_before_anything_is_sent(checkpoint, tmp_path, hub, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    assert export(checkpoint, tmp_path / "space", "--push-to-hub", "me/distrinews") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "hf auth login" in err and "HF_TOKEN" in err
    assert [c[0] for c in hub.calls] == []


def test_a_failed_upload_says_the_folder_is_complete(checkpoint, tmp_path, hub, capsys):
    hub.fail = ConnectionError("Name or service not known\nmore detail")
    assert export(checkpoint, tmp_path / "space", "--push-to-hub", "me/distrinews") == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "could not push" in err and "push it with git" in err
    assert (tmp_path / "space" / "Dockerfile").is_file()


@pytest.mark.parametrize("repo_id", ["distrinews", "a/b/c", "/x"])
def test_repo_ids_are_owner_slash_name(checkpoint, tmp_path, hub, repo_id, capsys):
    assert export(checkpoint, tmp_path / "space", "--push-to-hub", repo_id) == 2
    assert "want OWNER/NAME" in capsys.readouterr().err


def test_offline_refuses_to_push(checkpoint, tmp_path, hub, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert export(checkpoint, tmp_path / "space", "--push-to-hub", "me/distrinews") == 2
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err and hub.calls == []


def test_space_options_belong_to_format_space(checkpoint, capsys):
    assert main(["export", "--checkpoint", str(checkpoint), "--format", "pt", "--runtime", "torch"]) == 2
    assert "--runtime only apply to --format space" in capsys.readouterr().err

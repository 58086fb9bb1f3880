"""``distrinews predict --engine ray`` refusals that need no Ray: Ray not installed, ``--ray-address`` without it."""

from __future__ import annotations

import sys

import pytest

from distrinews import cli


@pytest.fixture
def corpus(tmp_path, write_rows):
    checkpoint = tmp_path / "best"
    checkpoint.mkdir()
    return checkpoint, write_rows(tmp_path / "news.jsonl", [{"text": "Oil prices jump after OPEC cuts output"}])


def predict(checkpoint, corpus, output, *args):
    return cli.main(
        ["predict", "--checkpoint", str(checkpoint), "--input", str(corpus), "--output", str(output), *args]
    )


def test_engine_ray_without_ray_installed_is_one_line_naming_the_extra_and_exit_2(
    tmp_path, corpus, monkeypatch, capsys
):
    checkpoint, news = corpus
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as on a machine without it
    output = tmp_path / "labels.jsonl"
    status = predict(checkpoint, news, output, "--engine", "ray")
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("distrinews: error: predict: --engine ray needs Ray Data")
    assert "pip install 'distrinews[ray]'" in err
    assert not output.exists() and not output.with_name(output.name + ".partial").exists()


def test_ray_address_without_engine_ray_is_refused(tmp_path, corpus, capsys):
    checkpoint, news = corpus
    status = predict(checkpoint, news, tmp_path / "labels.jsonl", "--ray-address", "head:6379")
    err = capsys.readouterr().err
    assert status == 2 and err == "distrinews: error: predict: --ray-address goes with --engine ray\n"


def test_the_ray_extra_brings_ray_data_and_dev_installs_it(repo_root):
    import tomllib

    extras = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.replace(" ", "").startswith("ray[data]") for req in extras["ray"])
    assert "ray" in extras["dev"][0].split("[", 1)[1].rstrip("]").split(",")


def test_an_actor_that_died_of_a_user_error_is_reported_as_that_error_in_one_line():
    from distrinews.errors import ConfigError
    from distrinews.predict.batch.ray_engine import _user_error
    from distrinews.predict.batch.shell import WorkerFailed

    class ActorDiedError(Exception):  # as Ray raises it: the actor's traceback as text, no exception chained
        __module__ = "ray.exceptions"

    died = ActorDiedError(
        'The actor died because of an error raised in its creation task\n  File "worker.py", line 77, in '
        "load_predictor\n"
        "distrinews.errors.ConfigError: predict: --runtime onnx-int8 needs onnxruntime\n"
    )
    error = _user_error(died)
    assert isinstance(error, ConfigError) and str(error) == "predict: --runtime onnx-int8 needs onnxruntime"
    crashed = _user_error(ActorDiedError("The actor died unexpectedly (out of memory)\nmore detail"))
    assert isinstance(crashed, WorkerFailed) and "\n" not in str(crashed) and "out of memory" in str(crashed)
    assert _user_error(ValueError("a bug of ours")) is None  # raised as it is, with its traceback
    stale = _user_error(
        ActorDiedError("...\nModuleNotFoundError: No module named 'distrinews.predict.batch.ray_engine'\n")
    )
    assert isinstance(stale, ConfigError) and "install the same distrinews on every machine" in str(stale)

"""A tuning database's password stays out of sight: the URL can come from ``$DISTRINEWS_TUNE_STORAGE`` or
``--storage-file`` instead of the command line (which every user sees in ``ps``), it reaches the trials through their
environment and never their command line, and no line the tuner or a trial says holds it.

The whole ``distrinews tune`` command runs here, in process, with its two far ends stood in for: the database (a URL
with a password needs a server; Optuna's in-memory storage takes its place once the URL has been read) and the
trials' processes (the spawner records the command and environment it is given, and writes the result a trial
would). Everything between, the URL's way through the tuner, is the real code; an unreachable database with the
real storage code is checked too."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import optuna
import pytest

from distrinews.cli import main
from distrinews.tune import TRIAL_ENV, study
from distrinews.tune.storage import STORAGE_ENV, redacted, scrubbed, storage_url

SECRET = "s3cret-Pw%40rd"  # percent-encoded, as a password with "@" must be in a URL
URL = f"postgresql://tuner:{SECRET}@127.0.0.1:9/studies"  # port 9: nothing listens there


def _tune_args(tmp_path: Path, configs_dir: Path) -> list[str]:
    (tmp_path / "space.yaml").write_text("learning_rate: {low: 1.0e-4, high: 1.0e-3, log: true}\n")
    config = str(configs_dir / "tiny.yaml")
    out = str(tmp_path / "study")
    return ["tune", "--config", config, "--space", str(tmp_path / "space.yaml"), "--output-dir", out, "--n-trials", "1"]


@pytest.fixture
def stand_ins(monkeypatch):
    """The database and the trials' processes stood in for: what was opened, and each trial's command and env."""
    seen: dict[str, list] = {"opened": [], "spawned": []}

    def open_storage(spec: str, *args) -> optuna.storages.BaseStorage:
        seen["opened"].append(spec)
        return optuna.storages.InMemoryStorage()

    def run_until_stopped(command: list[str], grace: float, **kwargs) -> int:
        seen["spawned"].append((command, kwargs["env"]))
        link = json.loads(kwargs["env"][TRIAL_ENV])
        Path(link["result"]).write_text(json.dumps({"state": "complete", "value": 0.5, "step": 1}) + "\n")
        return 0

    monkeypatch.setattr(study, "open_storage", open_storage)
    monkeypatch.setattr(study, "run_until_stopped", run_until_stopped)
    return seen


def _files_hold(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_password_from_the_environment_is_in_no_line_no_file_and_no_trial_command(
    tmp_path, monkeypatch, capsys, configs_dir, stand_ins
):
    monkeypatch.setenv(STORAGE_ENV, URL)
    assert main(_tune_args(tmp_path, configs_dir)) == 0
    said = capsys.readouterr()
    assert stand_ins["opened"] == [URL], "the storage is the environment's"
    (command, env), *_ = stand_ins["spawned"]
    assert command[:4] == [sys.executable, "-m", "distrinews", "train"] and not any(SECRET in a for a in command)
    assert not any("postgresql" in a for a in command), command
    assert json.loads(env[TRIAL_ENV])["storage"] == URL  # the trial reports to the study: through its environment
    assert SECRET not in said.out + said.err and "postgresql://tuner:***@127.0.0.1:9/studies" in said.out
    assert _files_hold(tmp_path / "study", SECRET) == []  # trial configs, logs, results
    assert "warning: --storage holds a password" not in said.err


def test_a_password_from_a_file(tmp_path, monkeypatch, capsys, configs_dir, stand_ins):
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    secret_file = tmp_path / "storage-url"
    secret_file.write_text(URL + "\n")
    assert main([*_tune_args(tmp_path, configs_dir), "--storage-file", str(secret_file)]) == 0
    assert stand_ins["opened"] == [URL] and SECRET not in "".join(capsys.readouterr())


def test_a_password_on_the_command_line_is_warned_of_and_an_unreachable_database_is_one_line(
    tmp_path, monkeypatch, capsys, configs_dir
):
    """The real storage code: the database is never reached (no driver, or nothing on port 9)."""
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    assert main([*_tune_args(tmp_path, configs_dir), "--storage", URL]) == 2
    said = capsys.readouterr()
    assert SECRET not in said.out + said.err and SECRET.replace("%40", "@") not in said.out + said.err
    warning, error = said.err.strip().splitlines()[-2:]
    assert warning.startswith("warning: --storage holds a password") and STORAGE_ENV in warning
    assert error.startswith("distrinews: error: --storage postgresql://tuner:***@127.0.0.1:9/studies: cannot open it")


def test_the_storage_comes_from_the_flag_else_the_file_else_the_environment(tmp_path, monkeypatch):
    from distrinews.errors import ConfigError

    monkeypatch.setenv(STORAGE_ENV, "sqlite:///from-env.db")
    file = tmp_path / "url"
    file.write_text("  sqlite:///from-file.db  \n# anything after the first line is not read\n")
    assert storage_url("sqlite:///flag.db", None) == "sqlite:///flag.db"
    assert storage_url(None, str(file)) == "sqlite:///from-file.db"
    assert storage_url(None, None) == "sqlite:///from-env.db"
    monkeypatch.delenv(STORAGE_ENV)
    assert storage_url(None, None) is None  # the journal in --output-dir
    with pytest.raises(ConfigError, match="give one"):
        storage_url("sqlite:///flag.db", str(file))
    for text in ("", "\n\n", "x" * (70 << 10)):
        file.write_text(text)
        with pytest.raises(ConfigError, match=r"--storage-file .*: want one line"):
            storage_url(None, str(file))
    with pytest.raises(ConfigError, match="cannot read it"):
        storage_url(None, str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://tuner:pa@ss@db/x", "postgresql://tuner:***@db/x"),  # "@" in a password, unencoded
        ("mysql+pymysql://u:p%40ss@db:3306/x?ssl=1", "mysql+pymysql://u:***@db:3306/x?ssl=1"),
        ("postgresql://tuner@db/x", "postgresql://tuner@db/x"),  # no password: nothing hidden
        ("sqlite:///runs/study.db", "sqlite:///runs/study.db"),
        (str(Path("runs") / "study.journal"), os.path.join("runs", "study.journal")),
    ],
)
def test_redacted_hides_the_password_only(url, shown):
    assert redacted(url) == shown


def test_an_error_quoting_the_url_is_scrubbed_in_either_form():
    url = "postgresql://u:p%40ss@db/x"
    text = "could not parse postgresql://u:p%40ss@db/x (password p@ss)"
    assert scrubbed(text, url) == "could not parse postgresql://u:***@db/x (password ***)"
    assert scrubbed("no password here", "sqlite:///x.db") == "no password here"


def test_a_trial_that_stops_reporting_says_why_without_the_password(tmp_path, capsys):
    import torch

    from distrinews.checkpoint.records import TrainState
    from distrinews.config import TrainConfig
    from distrinews.distributed.process_group import DistEnv
    from distrinews.train.callbacks import CallbackHandler
    from distrinews.tune.trial_callback import TrialCallback, TrialLink

    link = TrialLink(URL, "s", 0, 0, {"name": "none"}, str(tmp_path / "result.json"))
    callback, state = TrialCallback(link), TrainState()
    handler = CallbackHandler([callback], TrainConfig(), state, DistEnv(0, 0, 1, 1, torch.device("cpu"), None))

    class Gone:  # the database went away, and its driver's error quotes the URL
        def report(self, value, step):
            raise ConnectionError(f"lost {URL}")

    callback.trial = Gone()
    handler.on_evaluate({"accuracy": 0.5})
    out = capsys.readouterr().out
    assert "no longer reported to (ConnectionError: lost postgresql://tuner:***@127.0.0.1:9/studies)" in out
    assert SECRET not in out

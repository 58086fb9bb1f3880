"""Bad input through the command line: one line that names what is wrong, exit status 2, nothing touched.

With ``--nproc-per-node 2`` the launcher checks the run before any worker starts, so an error
appears once, never once per rank, and never with torchrun's ChildFailedError traceback.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import QUIET, TINY

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture
def train(cli):
    def run(*args, data=None, nproc=None):
        data_args = ["--data", str(data)] if data is not None else []
        return cli("train", *TINY, *data_args, "--disable_tqdm", "true", *args, nproc=nproc, check=False)

    return run


def _one_line_error(proc, *phrases):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("distrinews: error: ")
    for phrase in phrases:
        assert phrase in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("nproc", [None, 2])
def test_missing_data_directory(tmp_path, train, nproc):
    proc = train("--output-dir", str(tmp_path / "run"), data=tmp_path / "no-such-dir", nproc=nproc)
    _one_line_error(proc, "no-such-dir does not exist. Point --data (or $DISTRINEWS_DATA)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("nproc", [None, 2])
def test_malformed_csv_names_file_and_line(tmp_path, write_csv, train, nproc):
    data = tmp_path / "data"
    data.mkdir()
    write_csv(data / "train.csv", [("1", "a", "b")] * 10 + [("7", "bad", "label")])
    write_csv(data / "test.csv", [("1", "a", "b")] * 4)
    proc = train("--output-dir", str(tmp_path / "run"), data=data, nproc=nproc)
    _one_line_error(proc, f"{data / 'train.csv'}:11: class 7 is outside 1-4")
    assert not (tmp_path / "run").exists()


def test_unknown_config_key_under_torchrun_launcher(tmp_path, train):
    proc = train("--per_device_train_batch", "8", nproc=2)
    _one_line_error(proc, "unknown config field 'per_device_train_batch'", "did you mean 'per_device_train_batch_size'")


@pytest.mark.parametrize("nproc", [None, 2])
def test_model_path_that_does_not_exist(tmp_path, train, nproc):
    proc = train("--output-dir", str(tmp_path / "run"), "--model_name_or_path", str(tmp_path / "no-model"), nproc=nproc)
    _one_line_error(proc, "'model_name_or_path'", "no-model does not exist")


def test_output_dir_under_a_regular_file(tmp_path, train):
    (tmp_path / "a-file").write_text("not a directory")
    proc = train("--output-dir", str(tmp_path / "a-file" / "run"))
    _one_line_error(proc, "'output_dir'", "which is a file")


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_non_finite_epochs(tmp_path, train, value):
    proc = train("--output-dir", str(tmp_path / "run"), "--num_train_epochs", value)
    _one_line_error(proc, "'num_train_epochs': must be a finite number")


def test_launcher_flags_on_a_single_process_command(tmp_path, cli):
    proc = cli("predict", "--checkpoint", str(tmp_path), "Oil prices rise", nproc=2, check=False)
    _one_line_error(proc, "predict runs in one process")


def test_predict_rejects_empty_text(tmp_path, cli):
    proc = cli("predict", "--checkpoint", str(tmp_path), "   ", check=False)
    _one_line_error(proc, "text #1 is empty")


# Long enough that the winner still holds the directory when the other command, started with it, gets there.
RACE = ("--max_steps", "12", "--eval_samples", "64", "--bf16", "false", *QUIET)


@pytest.mark.parametrize("how", ["one process", "launcher", "plain torchrun"])
def test_two_runs_started_together_into_one_directory_one_is_refused(tmp_path, agnews_dir, how):
    run = tmp_path / "run"
    launcher = {
        "one process": [sys.executable, "-m", "distrinews"],
        "launcher": [sys.executable, "-m", "distrinews", "--nproc-per-node", "2"],
        "plain torchrun": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "1",
            "-m",
            "distrinews",
        ],
    }[how]
    cmd = [*launcher, "train", *TINY, *RACE, "--output-dir", str(run)]
    procs = [
        subprocess.Popen(cmd, cwd=CONFIGS.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    done = [subprocess.CompletedProcess(cmd, p.returncode, out, err) for p, (out, err) in zip(procs, outs)]
    codes = sorted(d.returncode for d in done)
    assert codes[0] == 0 and codes[1] != 0, (
        f"both ran into {run}: exit codes {codes}\n{done[0].stderr[-2000:]}\n{done[1].stderr[-2000:]}"
    )
    winner, loser = (0, 1) if done[0].returncode == 0 else (1, 0)
    refusal = f"distrinews: error: config field 'output_dir': {run} is locked by a run in progress (pid "
    if how == "plain torchrun":  # the refusal is rank 0's; torchrun's agent then adds its own report, exit 1
        assert refusal in done[loser].stderr, done[loser].stderr[-3000:]
    else:
        assert codes[1] == 2
        _one_line_error(done[loser], refusal, f"(pid {procs[winner].pid} on ", ".distrinews.lock")
    assert "TRAINING CONFIGURATION" not in done[loser].stdout, "the refused run trained nothing"
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in log].count("summary") == 1, "one run's log only"
    train_steps = [r["step"] for r in log if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-12"]
    assert (run / "best" / "model.safetensors").is_file()
    assert not (run / ".distrinews.lock").exists(), "the winner let go when it ended"


def test_the_seed_guides_training_command_trains(tmp_path, news_corpus):
    """The original system's guide trains with `torchrun --nproc_per_node=2 --standalone ... --epochs 3
    --batch_size 32 --learning_rate 2e-5`: the same flags train here, under torchrun itself, and mean the
    fields they name (one epoch and a small batch to keep it short)."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",
        "-m",
        "distrinews",
        "train",
    ]
    cmd += [
        *TINY,
        "--data",
        str(news_corpus),
        "--output-dir",
        str(out),
        *QUIET,
        "--train_samples",
        "64",
        "--eval_samples",
        "32",
    ]
    cmd += ["--epochs", "1", "--batch_size", "8", "--learning_rate", "2e-5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=CONFIGS.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["num_train_epochs"], saved["per_device_train_batch_size"], saved["learning_rate"]) == (1, 8, 2e-5)
    assert (out / "best" / "config.json").is_file() and "Replicas: identical" in proc.stdout + proc.stderr

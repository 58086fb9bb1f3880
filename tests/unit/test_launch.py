"""Our launcher: launcher flags are parsed once, torchrun's PET_* layout is honoured, failures read as one line."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from distrinews.distributed import launch
from distrinews.distributed.launch import (
    LaunchError,
    report_failures,
    spans_nodes,
    split_launch_flags,
    torchrun_args,
    wants_launch,
)

PET = (
    "PET_NPROC_PER_NODE",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_RDZV_ENDPOINT",
    "PET_RDZV_BACKEND",
    "PET_RDZV_ID",
    "PET_MAX_RESTARTS",
    "LOCAL_RANK",
    "WORLD_SIZE",
)


@pytest.fixture(autouse=True)
def _no_launcher_environment(monkeypatch):
    for name in PET:
        monkeypatch.delenv(name, raising=False)


def test_flags_come_out_in_any_spelling_and_the_rest_stays_in_order():
    flags, rest = split_launch_flags(
        [
            "train",
            "--nproc_per_node",
            "2",
            "--config",
            "c.yaml",
            "--nnodes=2",
            "--rdzv-endpoint",
            "h:29400",
            "--max-restarts",
            "3",
            "--learning_rate",
            "1e-4",
        ]
    )
    assert flags == {"nproc-per-node": "2", "nnodes": "2", "rdzv-endpoint": "h:29400", "max-restarts": "3"}
    assert rest == ["train", "--config", "c.yaml", "--learning_rate", "1e-4"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--nproc-per-node", "0"], "--nproc-per-node expects a number >= 1"),
        (["--nproc-per-node", "two"], "--nproc-per-node expects"),
        (["--nnodes", "2:x"], "--nnodes expects N or MIN:MAX"),
        (["--max-restarts", "many"], "--max-restarts expects an integer"),
        (["--node-rank"], "--node-rank needs a value"),
    ],
)
def test_malformed_flags_are_named(argv, message):
    with pytest.raises(LaunchError, match=message):
        split_launch_flags(argv)


def test_launch_when_flags_or_a_pet_layout_are_given_but_never_inside_a_worker(monkeypatch):
    assert not wants_launch({})
    assert wants_launch({"nproc-per-node": "2"})
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")  # what Kubeflow's torch runtime sets
    assert wants_launch({})
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert not wants_launch({"nproc-per-node": "2"})


def test_a_run_spans_nodes_when_more_than_one_node_may_join(monkeypatch):
    assert not spans_nodes({}) and not spans_nodes({"nnodes": "1"}) and not spans_nodes({"nproc-per-node": "4"})
    assert spans_nodes({"nnodes": "2"}) and spans_nodes({"nnodes": "1:4"})
    monkeypatch.setenv("PET_NNODES", "2")
    assert spans_nodes({})


def test_torchrun_arguments(monkeypatch):
    args = torchrun_args({"nproc-per-node": "2"}, ["train", "--config", "c.yaml"])
    assert args.nproc_per_node == "2" and args.module and args.training_script == "distrinews"
    assert args.training_script_args == ["train", "--config", "c.yaml"]
    assert args.master_port is None, "one node: torchrun picks a free port itself, never a fixed 29500"
    multi = torchrun_args({"nnodes": "2", "nproc-per-node": "1", "rdzv-endpoint": "h:29400"}, ["train"])
    assert multi.rdzv_backend == "c10d" and multi.rdzv_endpoint == "h:29400"
    # The operators' static layout (PET_MASTER_ADDR/PORT, no endpoint) stays static: c10d would fall back to localhost.
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_MASTER_ADDR", "job-master-0")
    monkeypatch.setenv("PET_MASTER_PORT", "23456")
    static = torchrun_args({}, ["train"])
    assert static.rdzv_backend == "static" and static.nnodes == "2" and static.master_addr == "job-master-0"


def _failure(exitcode, message="", timestamp=0):
    return SimpleNamespace(
        exitcode=exitcode,
        message=message,
        timestamp=timestamp,
        signal_name=lambda: signal.Signals(-exitcode).name if exitcode < 0 else "",
    )


def test_a_usage_error_on_every_rank_is_printed_once_with_exit_2(capsys):
    msg = "distrinews: error: /data/train.csv:11: class 7 is outside 1-4"
    assert report_failures({0: _failure(2, msg), 1: _failure(2, msg)}) == 2
    assert capsys.readouterr().err.splitlines() == [msg]


def test_a_usage_error_is_still_exit_2_when_the_launcher_stopped_the_other_ranks_first(capsys):
    msg = "distrinews: error: no space left to save runs/x/checkpoints/step-3: ..."
    assert report_failures({0: _failure(2, msg, timestamp=1), 1: _failure(-int(signal.SIGTERM), timestamp=1)}) == 2
    assert capsys.readouterr().err.splitlines() == [msg]


def test_a_rank_that_aborts_while_the_run_goes_down_does_not_hide_the_usage_error(capsys):
    # Seen under load: rank 0 stops on a full disk (exit 2), rank 1 aborts in its teardown ("terminate called
    # without an active exception", SIGABRT) in the same second or later.
    msg = "distrinews: error: no space left to save runs/x/checkpoints/step-3: ..."
    assert report_failures({0: _failure(2, msg, timestamp=7), 1: _failure(-int(signal.SIGABRT), timestamp=7)}) == 2
    assert capsys.readouterr().err.splitlines() == [msg]
    # ... stamped the second before the usage error (seen in CI: exit 1 instead of 2)
    assert report_failures({0: _failure(2, msg, timestamp=7), 1: _failure(-int(signal.SIGABRT), timestamp=6)}) == 2
    assert capsys.readouterr().err.splitlines() == [msg]
    # A rank killed before the usage error is a cause, and named
    failures = {0: _failure(2, msg, timestamp=7), 1: _failure(-int(signal.SIGKILL), timestamp=6)}
    assert report_failures(failures) == 1
    assert "worker rank 1 was killed by SIGKILL" in capsys.readouterr().err


def test_the_first_real_failure_is_named_not_the_ranks_the_launcher_stopped(capsys):
    failures = {0: _failure(-int(signal.SIGTERM), timestamp=5), 1: _failure(-int(signal.SIGKILL), timestamp=3)}
    assert report_failures(failures) == 1
    assert (
        capsys.readouterr().err.strip()
        == "distrinews: error: worker rank 1 was killed by SIGKILL; the other workers were stopped"
    )
    assert report_failures({3: _failure(1, "RuntimeError: boom", timestamp=1)}) == 1
    assert "worker rank 3 failed with exit code 1 (its output is above)" in capsys.readouterr().err


def test_a_worker_hands_its_error_to_our_launcher_only(tmp_path, monkeypatch):
    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.delenv(launch.LAUNCHED_ENV, raising=False)
    assert not launch.record_worker_error("distrinews: error: x")  # plain torchrun: the worker prints it itself
    monkeypatch.setenv(launch.LAUNCHED_ENV, "1")
    assert launch.record_worker_error("distrinews: error: x")
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    assert ProcessFailure(local_rank=0, pid=1, exitcode=2, error_file=str(error_file)).message == "distrinews: error: x"


def test_a_usage_error_is_handed_to_the_launcher_before_the_process_group_is_torn_down(tmp_path, monkeypatch):
    """Seen in CI: rank 0 stopped on a full disk, tore its process group down, and only then recorded its error;
    rank 1, blocked in a collective, aborted as the connections closed, and the launcher saw that abort first and
    exited 1 instead of 2. The error is recorded before the teardown, and the later record does not replace it."""
    import json

    import torch
    import torch.distributed as dist

    from distrinews.distributed import process_group
    from distrinews.errors import DiskFullError

    error_file = tmp_path / "error.json"
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    monkeypatch.setenv(launch.LAUNCHED_ENV, "1")
    monkeypatch.setattr(process_group, "die_with_launcher", lambda: None)
    monkeypatch.setattr(process_group, "_attempt_store", lambda timeout: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    at_teardown: list[str | None] = []
    monkeypatch.setattr(
        dist,
        "destroy_process_group",
        lambda: at_teardown.append(json.loads(error_file.read_text())["message"] if error_file.exists() else None),
    )
    with pytest.raises(DiskFullError), process_group.distributed_context(threads=torch.get_num_threads()):
        raise DiskFullError("no space left to save runs/x/checkpoints/step-3")
    assert at_teardown == ["distrinews: error: no space left to save runs/x/checkpoints/step-3"]
    first = json.loads(error_file.read_text())
    assert launch.record_worker_error("distrinews: error: no space left to save runs/x/checkpoints/step-3")
    assert json.loads(error_file.read_text()) == first  # the CLI's record, later, keeps the earlier time

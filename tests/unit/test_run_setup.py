"""What is decided before the first step: the run directory rule, the strategy, the GPU count, the step plan."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from conftest import require
from distrinews.checkpoint.records import TrainState
from distrinews.checkpoint.rundir import LOCK_FILE, RunDir
from distrinews.cli import main
from distrinews.config import ConfigError, TrainConfig
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.distributed.parallel import wrap_model
from distrinews.distributed.process_group import DistEnv, GpuShareError, check_one_gpu_per_process
from distrinews.train.build import StepPlan
from distrinews.train.components import optimizer_windows


def _previous_run(path):
    (path / "checkpoints" / "step-40").mkdir(parents=True)
    (path / "log.jsonl").write_text('{"kind": "train", "step": 40}\n')
    (path / "notes.txt").write_text("mine")
    return {p: p.stat().st_mtime_ns for p in path.rglob("*")}


def test_a_directory_holding_a_run_is_refused_without_resume_or_overwrite(tmp_path):
    before = _previous_run(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"already holds a run \(log.jsonl, checkpoints\); pass --resume auto .* --overwrite_output_dir true",
    ):
        RunDir(tmp_path).check_usable(resume=None, overwrite=False)
    RunDir(tmp_path).check_usable(resume="auto", overwrite=False)
    RunDir(tmp_path).check_usable(resume=None, overwrite=True)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before, "the check touches nothing"
    RunDir(tmp_path / "new").check_usable(resume=None, overwrite=False)


def test_the_train_command_refuses_before_touching_anything(tmp_path, capsys, configs_dir):
    before = _previous_run(tmp_path)
    assert main(["train", "--config", str(configs_dir / "tiny.yaml"), "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds a run" in err[0]
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_overwrite_removes_the_runs_artifacts_and_nothing_else(tmp_path):
    _previous_run(tmp_path)
    RunDir(tmp_path).prepare(TrainConfig(output_dir=str(tmp_path), overwrite_output_dir=True), resumed=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "notes.txt"]


def test_links_planted_in_a_run_directory_are_refused_or_removed_never_followed(tmp_path):
    from types import SimpleNamespace

    from distrinews.checkpoint.atomic import write_text_atomically
    from distrinews.train.metrics import JsonLogCallback, TensorBoardCallback

    def begin(callback, resumed_from=None):
        callback.on_train_begin(None, SimpleNamespace(global_step=10), None, resumed_from=resumed_from)

    victim, precious = tmp_path / "victim.txt", tmp_path / "precious"
    victim.write_text("keep me")
    precious.mkdir()
    (precious / "weights.bin").write_text("keep me too")
    run = tmp_path / "run"
    run.mkdir()
    for name in (LOCK_FILE, "log.jsonl", "config.yaml"):
        (run / name).symlink_to(victim)
    with pytest.raises(ConfigError, match=f"{LOCK_FILE} is a symbolic link; refusing to follow it"):
        RunDir(run).lock()  # the lock is truncated as it is taken
    with pytest.raises(ConfigError, match=r"log\.jsonl is a symbolic link"):
        begin(JsonLogCallback(RunDir(run)))
    with pytest.raises(ConfigError, match=r"log\.jsonl is a symbolic link"):
        begin(JsonLogCallback(RunDir(run)), resumed_from="step-10")
    with pytest.raises(ConfigError, match=r"config\.yaml is a symbolic link"):
        RunDir(run).prepare(TrainConfig(output_dir=str(run)), resumed=True)
    (run / f".notes.txt.{os.getpid()}.tmp").symlink_to(victim)  # an atomic write's temporary name
    write_text_atomically(run / "notes.txt", "new")
    assert (run / "notes.txt").read_text() == "new" and not (run / "notes.txt").is_symlink()
    (run / "log.jsonl").unlink()
    (run / "tb").symlink_to(precious)
    with pytest.raises(ConfigError, match=r"tb is a symbolic link"):
        begin(TensorBoardCallback(RunDir(run)))
    (run / "tb").unlink()
    require("matplotlib")
    from matplotlib.figure import Figure

    from distrinews.train.curves import save_figure

    (run / f".training_curves.png.{os.getpid()}.tmp.png").symlink_to(victim)
    save_figure(Figure(), RunDir(run).curves)
    assert RunDir(run).curves.read_bytes().startswith(b"\x89PNG")
    (run / "checkpoints").symlink_to(precious)
    (run / ".tmp-step-40").symlink_to(precious)
    RunDir(run).prepare(TrainConfig(output_dir=str(run), overwrite_output_dir=True), resumed=False)  # removes the links
    assert victim.read_text() == "keep me" and (precious / "weights.bin").read_text() == "keep me too"
    # the planted lock link is left (it is no artifact), the rest is the new run's
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE, "config.yaml", "notes.txt"]


def test_a_locked_run_directory_refuses_a_second_run_naming_the_holder(tmp_path):
    run = RunDir(tmp_path / "runs" / "a")
    with run.lock():
        assert run.lock_file.is_file()
        # flock is per open file: a second open in this same process is refused like another process would be
        with pytest.raises(
            ConfigError, match=rf"'output_dir': .*runs/a is locked by a run in progress \(pid {os.getpid()} on "
        ):
            run.lock()
        (run.path / "log.jsonl").write_text("{}\n")
        assert run.previous_run() == ["log.jsonl"], "the lock file is not a previous run"
        run.clear()  # what --overwrite_output_dir does, under the lock
        assert sorted(p.name for p in run.path.iterdir()) == [LOCK_FILE]
        with pytest.raises(ConfigError, match="is locked by a run in progress"):
            run.lock()
    assert not (tmp_path / "runs").exists(), "a directory made only for the lock goes with it"
    with run.lock():
        run.config.write_text("x")
    assert sorted(p.name for p in run.path.iterdir()) == ["config.yaml"]


def test_the_lock_of_a_killed_run_does_not_block_the_next(tmp_path):
    run = RunDir(tmp_path / "run")
    hold = (
        "import sys, time; from distrinews.checkpoint.rundir import RunDir; "
        "RunDir(sys.argv[1]).lock(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=rf"\(pid {holder.pid} on {socket.gethostname()} since "):
            run.lock()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert run.lock_file.is_file(), "SIGKILL left the file"
    with run.lock():
        pass


def test_a_file_system_without_locks_warns_and_runs_and_the_batch_lock_says_so(tmp_path, monkeypatch, capsys):
    """Some network file systems are mounted without flock: a run there warns and goes on (refusing every run would
    be worse); the batch job's lock raises, as an OSError, for its caller to say so."""
    import errno
    import fcntl
    import types

    from distrinews.checkpoint import file_lock

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    public = {name: getattr(fcntl, name) for name in dir(fcntl) if not name.startswith("_")}
    monkeypatch.setattr(file_lock, "fcntl", types.SimpleNamespace(**{**public, "flock": flock}))
    run = RunDir(tmp_path / "run")
    with run.lock():
        pass
    err = capsys.readouterr().err
    assert f"warning: cannot lock {run.lock_file} (" in err and "nothing stops a second run" in err
    with pytest.raises(OSError) as raised:
        file_lock.FileLock(tmp_path / "job.partial" / "lock").acquire()
    assert raised.value.errno == errno.ENOLCK


def test_the_train_command_locks_before_checking_and_lets_go_when_refused(tmp_path, capsys, configs_dir):
    run = RunDir(tmp_path / "run")
    with run.lock():
        assert main(["train", "--config", str(configs_dir / "tiny.yaml"), "--output-dir", str(run.path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run.path} is locked by a run in progress (pid {os.getpid()} on" in err[0]
    assert not run.path.exists()


def test_single_strategy_refuses_several_processes():
    model = torch.nn.Linear(2, 2)
    two = DistEnv(0, 0, 2, 2, torch.device("cpu"), "gloo")
    with pytest.raises(ConfigError, match="'single' cannot run with 2 processes"):
        wrap_model(model, TrainConfig(strategy="single").parallel, two)
    one = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)
    wrapped = wrap_model(model, TrainConfig(strategy="ddp").parallel, one)
    assert wrapped.module is model and not wrapped.replicated and wrapped.gradient_bytes() == 0


def test_shared_memory_average_is_refused_where_ranks_are_on_several_hosts():
    two_hosts = DistEnv(0, 0, 2, 1, torch.device("cpu"), "gloo")
    with pytest.raises(
        ConfigError, match="'ddp_comm_hook': shm cannot run here: 2 ranks, 1 on this host; use auto or none"
    ):
        wrap_model(torch.nn.Linear(2, 2), TrainConfig(ddp_comm_hook="shm").parallel, two_hosts)
    with pytest.raises(ConfigError, match="'ddp_comm_hook': must be one of auto, none, shm, bf16, fp16"):
        TrainConfig(ddp_comm_hook="nvlink")


def test_more_processes_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_one_gpu_per_process(1)
    with pytest.raises(GpuShareError, match="2 processes on this node but 1 GPU"):
        check_one_gpu_per_process(2)


def test_step_plan_and_windows():
    plan = StepPlan.of(
        TrainConfig(per_device_train_batch_size=4, gradient_accumulation_steps=3).batches, rows_per_rank=50
    )
    assert (plan.micro_per_epoch, plan.steps_per_epoch, plan.total_steps, plan.num_epochs) == (13, 5, 5, 1)
    windows = list(optimizer_windows(range(13), 3))
    assert [len(w) for w in windows] == [3, 3, 3, 3, 1]
    capped = StepPlan.of(TrainConfig(per_device_train_batch_size=4, max_steps=12).batches, rows_per_rank=50)
    assert (capped.steps_per_epoch, capped.total_steps, capped.num_epochs) == (13, 12, 1)


def test_train_state_round_trip():
    state = TrainState(global_step=7, epoch=1, step_in_epoch=2, best_accuracy=0.5, last_eval={"accuracy": 0.5})
    fresh = TrainState()
    fresh.load_state_dict({**state.state_dict(), "an_older_field": 1})
    assert fresh == state


def test_fast_dropout_keeps_the_right_fraction_and_scales_what_it_keeps():
    from distrinews.model import build_model
    from distrinews.train.dropout import FastDropout, use_fast_dropout

    torch.manual_seed(0)
    drop = FastDropout(0.1).train()
    x = torch.ones(400_000, requires_grad=True)
    y = drop(x)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.1) < 0.003
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept), "backward passes gradient exactly where forward kept the input"
    torch.manual_seed(1)
    first = drop(torch.ones(1000))
    torch.manual_seed(1)
    assert torch.equal(drop(torch.ones(1000)), first), "the global generator decides the mask: runs repeat"
    assert torch.equal(drop.eval()(x), x)
    model = build_model("tiny-random", labels=AG_NEWS_LABELS, seed=0, dropout=0.1)
    assert (
        use_fast_dropout(model) == 2 * 3 + 2
    )  # per layer: attention probabilities, attention output, feed-forward; + 2
    assert not any(type(m) is torch.nn.Dropout for m in model.modules())


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant_with_warmup"])
@pytest.mark.parametrize(("warmup", "total"), [(0, 10), (3, 10), (10, 10), (4, 1)])
def test_the_learning_rate_schedules_are_hugging_faces_step_for_step(kind, warmup, total):
    from transformers import get_scheduler

    from distrinews.train.components import schedule_with_warmup

    def lrs(make):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        scheduler = make(optimizer)
        out = []
        for _ in range(total + 3):
            out.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return out

    ours = lrs(lambda opt: schedule_with_warmup(opt, kind, warmup, total))
    assert ours == lrs(lambda opt: get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total))
    if kind == "cosine" and warmup < total:
        assert ours[warmup] == 0.5 and ours[total] == 0.0 and ours[warmup + (total - warmup) // 2] < 0.5


def test_layerwise_lr_decay_gives_each_layer_its_rate_and_one_rate_keeps_the_two_groups():
    from distrinews.config import TrainConfig
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model
    from distrinews.train.build import build_optimizer

    model = build_model("tiny-random", labels=AG_NEWS_LABELS, seed=0)  # 2 encoder layers
    cfg = TrainConfig(learning_rate=1e-3, layerwise_lr_decay=0.5, weight_decay=0.01)
    optimizer = build_optimizer(model, cfg.optimizer, torch.device("cpu"))
    rate = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert rate[id(params["classifier.weight"])] == (1e-3, 0.01)
    assert rate[id(params["bert.encoder.layer.1.attention.self.query.weight"])] == (5e-4, 0.01)
    assert rate[id(params["bert.encoder.layer.0.output.LayerNorm.weight"])] == (2.5e-4, 0.0)
    assert rate[id(params["bert.embeddings.word_embeddings.weight"])] == (1.25e-4, 0.01)
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(params)

    plain = build_optimizer(model, TrainConfig(learning_rate=1e-3).optimizer, torch.device("cpu"))
    assert [(g["lr"], g["weight_decay"]) for g in plain.param_groups] == [(1e-3, 0.01), (1e-3, 0.0)]


def test_freeze_layers_trains_only_above_the_bottom_layers_and_the_backward_pass_stops_there():
    from distrinews.model import build_model, freeze_layers

    model = build_model("tiny-random", labels=list(AG_NEWS_LABELS), dropout=0.0, seed=0)
    frozen = freeze_layers(model, 1)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith(("bert.encoder.layer.1.", "bert.pooler.", "classifier.")) for n in trained)
    assert frozen == sum(p.numel() for p in model.parameters()) - sum(
        p.numel() for n, p in model.named_parameters() if n in trained
    )
    graph = []  # whether each layer's output is in autograd's graph
    for layer in model.bert.encoder.layer:
        layer.register_forward_hook(
            lambda module, args, out: graph.append((out[0] if isinstance(out, tuple) else out).requires_grad)
        )
    ids = torch.randint(5, 1000, (2, 12))
    model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])).loss.backward()
    assert graph == [False, True], "the frozen bottom runs outside the backward graph"
    assert all(p.grad is None for p in model.bert.encoder.layer[0].parameters())
    with pytest.raises(
        ConfigError,
        match=r"config field 'freeze_layers': the model has 2 encoder layers, so 0-1 can be frozen \(got 2\)",
    ):
        freeze_layers(build_model("tiny-random", labels=list(AG_NEWS_LABELS), dropout=0.0, seed=0), 2)
    with pytest.raises(ConfigError, match="config field 'freeze_layers': must be >= 0"):
        TrainConfig(freeze_layers=-1)
    with pytest.raises(ConfigError, match="config field 'freeze_layers': LoRA already freezes the base model"):
        TrainConfig(freeze_layers=1, use_peft=True)


def test_the_fsdp_banner_gathers_every_parameter_and_reduces_only_the_trained_ones():
    """Frozen weights are sharded and all-gathered like the others, but have no gradient to reduce-scatter."""
    from distrinews.distributed.parallel import ShardedModel
    from distrinews.model import build_model, freeze_word_embeddings

    model = build_model("tiny-random", labels=list(AG_NEWS_LABELS), dropout=0.0, seed=0)
    every = sum(p.numel() * 4 for p in model.parameters())
    frozen = freeze_word_embeddings(model) * 4
    words = ShardedModel(model, model, "fsdp", DistEnv(0, 0, 2, 2, torch.device("cpu"), "gloo")).communication()
    assert f"all-gather of {every / 2**20:.1f} MiB of parameters" in words, words
    assert f"reduce-scatter of {(every - frozen) / 2**10:.1f} KiB of gradients" in words, words

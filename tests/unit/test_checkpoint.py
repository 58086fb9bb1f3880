import errno
import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from distrinews.checkpoint import servable
from distrinews.checkpoint.disk_space import _says_disk_full, _size
from distrinews.checkpoint.manifest import list_checkpoints, resolve_resume, rotate_checkpoints, verify_checkpoint
from distrinews.checkpoint.records import CheckpointFormat, ServableInfo, TrainState, recognise
from distrinews.checkpoint.resumable import Checkpointer, load_weights, restore_rng_state, save_weights
from distrinews.checkpoint.rundir import clean_stale_tmp
from distrinews.checkpoint.servable import check_loadable, load_for_inference, save_servable
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.distributed.parallel import ParallelModel
from distrinews.distributed.process_group import DistEnv
from distrinews.errors import CheckpointError, DiskFullError
from distrinews.export.seed_pt_writer import export_seed_pt
from distrinews.model import build_model, build_tokenizer

ONE_PROCESS = DistEnv(0, 0, 1, 1, torch.device("cpu"), None)


@pytest.fixture(scope="module")
def tiny():
    return build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0), build_tokenizer("tiny-random")


def _parts(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return ParallelModel(model, model, "ddp", ONE_PROCESS), opt, sched


def _save_step(root, step, model, limit=None):
    wrapped, opt, sched = _parts(model)
    checkpointer = Checkpointer(root, ONE_PROCESS, limit, {"model_name_or_path": "tiny-random"})
    return checkpointer.save(
        step,
        wrapped,
        opt,
        sched,
        None,
        TrainState(epoch=0, step_in_epoch=step, label_names=list(AG_NEWS_LABELS)),
    )


def _stepping_parts(model):
    """``_parts`` with a schedule that moves: the learning rate halves every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    return ParallelModel(model, model, "ddp", ONE_PROCESS), opt, sched


def _train_step(model, opt, sched, batch) -> None:
    model(**batch).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)


def _draws() -> tuple:
    """The next value of every generator a checkpoint captures."""
    import random

    import numpy as np

    return random.random(), torch.rand(4), np.random.rand(3)


def test_resumable_checkpoint_round_trip(tmp_path, tiny):
    """Two AdamW steps, saved, loaded into a fresh model: the optimizer's moments and step counts, the schedule and
    the weights are back, the next step gives bit-equal weights, and the RNG states reproduce the next draws."""
    import copy
    import random

    import numpy as np

    model = copy.deepcopy(tiny[0]).train()
    g = torch.Generator().manual_seed(0)
    batches = [
        {"input_ids": torch.randint(5, 1000, (4, 12), generator=g), "labels": torch.randint(0, 4, (4,), generator=g)}
        for _ in range(3)
    ]
    wrapped, opt, sched = _stepping_parts(model)
    for batch in batches[:2]:
        _train_step(model, opt, sched, batch)
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    checkpointer = Checkpointer(tmp_path, ONE_PROCESS, None, {"model_name_or_path": "tiny-random"})
    path = checkpointer.save(2, wrapped, opt, sched, None, TrainState(epoch=0, step_in_epoch=2))
    expected_draws = _draws()
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
        "optimizer.pt",
        "rng_state.pt",
        "scheduler.pt",
        "trainer_state.json",
    ]
    fresh = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=1).train()
    assert not all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    fresh_wrapped, fresh_opt, fresh_sched = _stepping_parts(fresh)
    loaded = Checkpointer(tmp_path, ONE_PROCESS, None, {}).load(path, fresh_wrapped, fresh_opt, fresh_sched, None)
    assert loaded.trainer_state.global_step == 2 and loaded.world_size == 1 and len(loaded.rng_states) == 1
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        saved, back = opt.state[p], fresh_opt.state[q]
        assert float(back["step"]) == float(saved["step"]) == 2.0, name
        assert torch.equal(back["exp_avg"], saved["exp_avg"]) and torch.equal(
            back["exp_avg_sq"], saved["exp_avg_sq"]
        ), name
        assert back["exp_avg_sq"].abs().sum() > 0, f"{name}: the steps moved the moments"
    assert fresh_sched.state_dict()["last_epoch"] == 2 and fresh_sched.get_last_lr() == sched.get_last_lr() == [
        1e-3 * 0.25
    ]

    _train_step(model, opt, sched, batches[2])
    _train_step(fresh, fresh_opt, fresh_sched, batches[2])
    for (k, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), f"{k}: the step after loading differs"

    torch.manual_seed(99)  # anything else: the loaded states must put every generator back
    random.seed(99)
    np.random.seed(99)
    restore_rng_state(loaded.rng_states[0])
    again = _draws()
    assert again[0] == expected_draws[0] and torch.equal(again[1], expected_draws[1])
    assert np.array_equal(again[2], expected_draws[2])


def test_kill_mid_save_leaves_previous_checkpoint_whole(tmp_path, tiny, monkeypatch):
    model, _ = tiny
    _save_step(tmp_path, 1, model)

    def boom(*a, **k):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        _save_step(tmp_path, 2, model)
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-1"]
    assert load_file(str(tmp_path / "step-1" / "model.safetensors"))
    assert resolve_resume("auto", tmp_path).name == "step-1", "auto resumes from the last whole checkpoint"
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers, "the half-written save stays under a temp name"
    clean_stale_tmp(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert [p.name for p in tmp_path.iterdir()] == ["step-1"]


def test_a_kill_between_the_renames_of_best_leaves_the_previous_best_after_cleaning(tmp_path, tiny, monkeypatch):
    """publish_dir moves best/ aside, then the new one in: stopped between the two, the next run's cleaning puts
    the previous best/ back instead of deleting it. (test_resume kills a run there for real.)"""
    from distrinews.checkpoint import atomic

    model, tok = tiny
    save_servable(
        tmp_path / "best", model, model.state_dict(), tok, ServableInfo(metrics={"accuracy": 0.1}, max_length=64)
    )
    replace = os.replace

    def stopped_after_moving_aside(src, dst):
        replace(src, dst)
        if os.path.basename(dst).startswith(".old-"):
            raise KeyboardInterrupt("killed between the renames")

    monkeypatch.setattr(atomic.os, "replace", stopped_after_moving_aside)
    with pytest.raises(KeyboardInterrupt):
        save_servable(
            tmp_path / "best", model, model.state_dict(), tok, ServableInfo(metrics={"accuracy": 0.2}, max_length=64)
        )
    monkeypatch.undo()
    assert not (tmp_path / "best").exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".old-best-")]
    clean_stale_tmp(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["best"]
    assert json.loads((tmp_path / "best" / "distrinews.json").read_text())["metrics"]["accuracy"] == 0.1
    check_loadable(tmp_path / "best")


def test_tied_weights_are_stored_once_and_load_back(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as language-model heads are
    save_weights(model.state_dict(), tmp_path / "w.safetensors")
    assert list(load_file(str(tmp_path / "w.safetensors"))) == ["0.weight"]
    fresh = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    fresh[1].weight = fresh[0].weight
    load_weights(fresh, tmp_path / "w.safetensors")
    assert torch.equal(fresh[1].weight, model[0].weight)
    untied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    with pytest.raises(ValueError, match="do not match"):
        load_weights(untied, tmp_path / "w.safetensors")


def test_rotation_keeps_the_newest(tmp_path, tiny):
    model, _ = tiny
    for step in (10, 2, 30, 20):
        _save_step(tmp_path, step, model)
    removed = rotate_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["step-10", "step-2"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-20", "step-30"]
    _save_step(tmp_path, 40, model, limit=2)  # the checkpointer rotates after each save
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-30", "step-40"]


def test_resolve_resume(tmp_path, tiny):
    model, _ = tiny
    checkpoints = tmp_path / "run" / "checkpoints"
    assert resolve_resume("auto", checkpoints) is None
    assert resolve_resume(None, checkpoints) is None
    _save_step(checkpoints, 3, model)
    _save_step(checkpoints, 12, model)
    assert resolve_resume("auto", checkpoints).name == "step-12"
    assert resolve_resume(str(checkpoints / "step-3"), checkpoints).name == "step-3"
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
        resolve_resume(str(tmp_path / "nope"), checkpoints)


def test_servable_replaces_previous_and_loads_with_transformers(tmp_path, tiny):
    from transformers import pipeline

    model, tok = tiny
    save_servable(
        tmp_path / "best", model, model.state_dict(), tok, ServableInfo(metrics={"accuracy": 0.1}, max_length=64)
    )
    save_servable(
        tmp_path / "best", model, model.state_dict(), tok, ServableInfo(metrics={"accuracy": 0.2}, max_length=64)
    )
    assert sorted(os.listdir(tmp_path)) == ["best"]
    info = json.loads((tmp_path / "best" / "distrinews.json").read_text())
    assert info["metrics"]["accuracy"] == 0.2 and info["label_names"] == ["World", "Sports", "Business", "Sci/Tech"]
    config = json.loads((tmp_path / "best" / "config.json").read_text())
    assert config["id2label"] == {"0": "World", "1": "Sports", "2": "Business", "3": "Sci/Tech"}
    out = pipeline("text-classification", model=str(tmp_path / "best"))("Oil prices rise")
    assert out[0]["label"] in info["label_names"]


def test_legacy_pt_export_and_load(tmp_path, tiny):
    model, tok = tiny
    save_servable(
        tmp_path / "best",
        model,
        model.state_dict(),
        tok,
        ServableInfo(metrics={"accuracy": 0.25, "loss": 1.3}, max_length=64, epoch=1),
    )
    out = export_seed_pt(tmp_path / "best", tmp_path / "model.pt")
    payload = torch.load(out, weights_only=True)
    assert set(payload) == {"epoch", "model_state_dict", "optimizer_state_dict", "loss", "accuracy", "config"}
    assert (
        payload["accuracy"] == 25.0 and payload["config"]["max_length"] == 64 and payload["config"]["num_labels"] == 4
    )
    loaded, _tok2, info = load_for_inference(out)
    enc = tok(["Stocks rally on Wall Street"], return_tensors="pt")
    with torch.no_grad():
        a = model.eval()(**enc).logits
        b = loaded(**enc).logits
    assert torch.allclose(a, b, atol=1e-6)
    assert info.max_length == 64
    assert info.tokenizer.to_json() == {
        "source": "recorded_path",
        "path": str(tmp_path / "best"),
    }  # the .pt names the folder it came from


def test_reference_style_wrapped_state_dict_loads(tmp_path, tiny):
    """The reference system saved NewsClassifier.state_dict(): keys prefixed with 'model.'."""
    model, tok = tiny
    save_servable(tmp_path / "best", model, model.state_dict(), tok, ServableInfo(max_length=64))
    path = export_seed_pt(tmp_path / "best", tmp_path / "legacy.pt")
    payload = torch.load(path, weights_only=True)
    payload["model_state_dict"] = {f"model.{k}": v for k, v in payload["model_state_dict"].items()}
    torch.save(payload, path)
    loaded, _, _ = load_for_inference(path)
    assert torch.equal(loaded.classifier.weight, model.classifier.weight)


def test_seed_pt_naming_no_tokenizer_is_refused_in_one_line(tmp_path, tiny):
    model, tok = tiny
    save_servable(tmp_path / "best", model, model.state_dict(), tok, ServableInfo(max_length=64))
    path = export_seed_pt(tmp_path / "best", tmp_path / "seed.pt")
    payload = torch.load(path, weights_only=True)
    del payload["config"]["model_name"], payload["config"]["tokenizer"]
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="names neither a base model nor a tokenizer"):
        load_for_inference(path)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ([1, 2], "it holds a list, not a dict"),
        ({"model_state_dict": {}}, "missing ['config']"),
    ],
)
@pytest.mark.parametrize("load", [check_loadable, load_for_inference], ids=["check_loadable", "load_for_inference"])
def test_a_pt_file_of_another_shape_is_refused_in_one_line_before_a_server_starts(tmp_path, payload, why, load):
    path = tmp_path / "other.pt"
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as refused:
        load(path)
    assert str(refused.value) == (
        f"could not load checkpoint {path}: not a DistriNews or legacy .pt checkpoint ({why})"
    )


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="not a checkpoint"):
        load_for_inference(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_for_inference(tmp_path / "missing")


@pytest.mark.parametrize(
    ("files", "kind", "servable", "sharded"),
    [
        (["config.json", "distrinews.json"], "pretrained", True, False),  # best/
        (["config.json"], "pretrained", False, False),  # any Hugging Face folder
        (["config.json", "trainer_state.json", "model.safetensors"], "resumable", False, False),  # step-N
        (["config.json", "trainer_state.json", "sharded/.metadata"], "resumable", False, True),
        (["distrinews.json", "trainer_state.json"], "resumable", False, False),  # no model config: not best/
    ],
)
def test_the_format_is_told_once_from_the_file_names(tmp_path, files, kind, servable, sharded):
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert recognise(tmp_path) == CheckpointFormat(tmp_path, kind, servable=servable, sharded=sharded)
    (tmp_path / "x.pt").write_bytes(b"")
    assert recognise(tmp_path / "x.pt") == CheckpointFormat(tmp_path / "x.pt", "pt")


@pytest.mark.parametrize("damage", ["truncate", "delete", "flip", "no-manifest"])
def test_a_damaged_newest_checkpoint_is_skipped_by_auto_and_refused_by_path(tmp_path, tiny, damage):
    model, _ = tiny
    _save_step(tmp_path, 10, model)
    newest = _save_step(tmp_path, 20, model)
    verify_checkpoint(newest)
    weights = newest / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "delete":
        (newest / "optimizer.pt").unlink()
    elif damage == "flip":
        data = bytearray(weights.read_bytes())
        data[-7] ^= 0xFF  # same size, different bytes
        weights.write_bytes(bytes(data))
    else:
        (newest / "manifest.json").unlink()  # killed before the save finished
    warnings = []
    assert resolve_resume("auto", tmp_path, warn=warnings.append).name == "step-10"
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipping step-20: ")
    with pytest.raises(CheckpointError) as exc:
        resolve_resume(str(newest), tmp_path)
    message = str(exc.value)
    assert "\n" not in message and str(newest) in message
    expected = {
        "truncate": "model.safetensors has 1,000 bytes",
        "delete": "optimizer.pt is missing",
        "flip": "model.safetensors does not match its checksum",
        "no-manifest": "no manifest.json",
    }[damage]
    assert expected in message


def _fill_disk_midway(monkeypatch, free: int):
    """torch.save as it fails on a full disk: part of the file written, then the zip writer's error
    (no errno in it); ``shutil.disk_usage`` reports ``free`` bytes left."""
    real_save = torch.save

    def save(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            path.write_bytes(b"\0" * 4096)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 9664 vs 9556")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(
        shutil, "disk_usage", lambda _path: SimpleNamespace(total=1 << 50, used=(1 << 50) - free, free=free)
    )


def test_a_save_that_runs_out_of_space_is_one_error_naming_the_space_and_the_checkpoint_to_resume(
    tmp_path, tiny, monkeypatch
):
    model, _ = tiny
    previous = _save_step(tmp_path, 1, model)
    size = sum(p.stat().st_size for p in previous.iterdir())
    _fill_disk_midway(monkeypatch, free=5000)
    with pytest.raises(DiskFullError) as exc:
        _save_step(tmp_path, 2, model)
    message = str(exc.value)
    assert "\n" not in message and "inline_container" not in message
    assert message.startswith(f"no space left to save {tmp_path / 'step-2'}: the filesystem mounted at /"), message
    assert f"has 4.9 KiB free, the save needs about {_size(size)}, the size of step-1" in message, message
    assert message.endswith(
        f"the newest complete checkpoint is {previous}: free some space, then continue with --resume auto"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-1"], "the half-written step-2 is removed"


def test_with_no_checkpoint_yet_the_error_says_so_and_estimates_from_the_tensors(tmp_path, tiny, monkeypatch):
    model, _ = tiny
    _fill_disk_midway(monkeypatch, free=0)
    with pytest.raises(
        DiskFullError, match=r"needs at least [\d.]+ MiB for its tensors; .*there is no complete checkpoint"
    ):
        _save_step(tmp_path, 1, model)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_with_room_to_spare_is_not_called_a_full_disk(tmp_path, tiny, monkeypatch):
    model, _ = tiny
    _fill_disk_midway(monkeypatch, free=1 << 40)
    with pytest.raises(RuntimeError, match="inline_container") as exc:
        _save_step(tmp_path, 1, model)
    assert not isinstance(exc.value, DiskFullError)
    assert list(tmp_path.iterdir()) == [], "the half-written save is removed whatever stopped it"


@pytest.mark.parametrize(
    ("exc", "full"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (
            RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
            True,
        ),  # safetensors
        (RuntimeError("unexpected pos 576 vs 534"), False),  # torch: decided by the free space instead
        (PermissionError(errno.EACCES, "Permission denied"), False),
    ],
)
def test_what_reads_as_a_full_disk(exc, full):
    assert _says_disk_full(exc) is full
    try:
        try:
            raise exc
        except Exception as inner:
            raise RuntimeError("torch.distributed.checkpoint could not save") from inner
    except RuntimeError as outer:
        assert _says_disk_full(outer) is full, "found through the chain too"


def test_a_servable_save_that_fails_leaves_no_temp_dir(tmp_path, tiny, monkeypatch):
    model, tok = tiny

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(servable, "write_model_card", full)
    with pytest.raises(OSError, match="No space left"):
        save_servable(tmp_path / "best", model, model.state_dict(), tok, ServableInfo(max_length=64))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("load", [check_loadable, load_for_inference], ids=["check_loadable", "load_for_inference"])
def test_a_servable_folder_without_its_tokenizer_is_refused(tmp_path, tiny, load):
    """Without its tokenizer files transformers would build an empty vocabulary ([UNK] for every word) and serve it."""
    from distrinews.model import resolve_model_path

    model, tok = tiny
    best = save_servable(
        tmp_path / "best", model, model.state_dict(), tok, ServableInfo(max_length=64, model_name="tiny-random")
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (best / name).unlink(missing_ok=True)
    with pytest.raises(CheckpointError) as refused:
        load(best)
    message = str(refused.value)
    assert message.startswith(
        f"could not load checkpoint {best}: its tokenizer is missing (no tokenizer.json, tokenizer_config.json"
    )
    assert f"from_pretrained('{resolve_model_path('tiny-random')}').save_pretrained('{best}')" in message
    assert "\n" not in message


def test_sharded_metadata_is_read_without_running_code_or_leaving_its_folder(tmp_path):
    """The metadata of a sharded checkpoint: what torch writes reads back; a pickle that names anything else,
    or a shard outside its folder, is refused before anything is built from it."""
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    from distrinews.checkpoint.sharded_reader import read_metadata

    def written(shard: str):
        chunk = ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))
        tensor = TensorStorageMetadata(TensorProperties(dtype=torch.bfloat16), torch.Size([2]), [chunk])
        metadata = Metadata(
            {"w": tensor}, storage_data={MetadataIndex("w", torch.Size([0])): _StorageInfo(shard, 0, 8)}
        )
        path = tmp_path / shard.replace("/", "_")
        path.write_bytes(pickle.dumps(metadata))
        return path

    assert read_metadata(written("__0_0.distcp")).state_dict_metadata["w"].size == torch.Size([2])
    with pytest.raises(CheckpointError, match=r"names the shard '\.\./\.\./secret', not a file of its folder"):
        read_metadata(written("../../secret"))

    class Code:
        def __reduce__(self):
            return (print, ("ran",))

    (tmp_path / "code").write_bytes(pickle.dumps(Code()))
    with pytest.raises(CheckpointError, match=r"refers to builtins\.print, which a checkpoint's metadata never holds"):
        read_metadata(tmp_path / "code")

"""DDP over 2 processes is the same optimisation as 1 process with the global batch."""

from safetensors.torch import load_file

from conftest import SIX_STEPS, SIX_STEPS_DDP
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model

STEPS = 6


def _layout(batch, accum, group):
    return (
        "--per_device_train_batch_size",
        str(batch),
        "--gradient_accumulation_steps",
        str(accum),
        "--group_by_length",
        str(group).lower(),
    )


def _train(tmp_path, name, nproc, batch, accum, group, cli, six_steps_ddp):
    if nproc == 2 and (*SIX_STEPS, *_layout(batch, accum, group)) == SIX_STEPS_DDP:
        out = six_steps_ddp[0]  # this very run, done once for the session: test_fsdp compares FSDP with it too
    else:
        out = tmp_path / name
        cli("train", *SIX_STEPS, "--output-dir", str(out), *_layout(batch, accum, group), nproc=nproc)
    return load_file(str(out / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_two_processes_equal_one_with_the_global_batch(tmp_path, cli, six_steps_ddp):
    """Length-grouped and plain sampling; with accumulation for both, without it for the grouped one."""
    init = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=42).state_dict()
    for group, per_rank in ((True, ((8, 1), (4, 2))), (False, ((4, 2),))):
        single = _train(tmp_path, f"single-{group}", None, 16, 1, group, cli, six_steps_ddp)
        assert _max_diff(single, {k: init[k] for k in single}) > 1e-3, "training must move the weights"
        for batch, accum in per_rank:
            ddp = _train(tmp_path, f"ddp-{group}-{batch}x{accum}", 2, batch, accum, group, cli, six_steps_ddp)
            assert _max_diff(single, ddp) < 1e-5, (group, batch, accum)


def test_shared_memory_average_is_gloos_bit_for_bit(tmp_path, cli, six_steps_ddp):
    """Two ranks on one host average through /dev/shm by default (ddp_comm_hook auto); the same run
    through gloo's all-reduce (ddp_comm_hook none) ends with the very same weights."""
    run, out = six_steps_ddp
    assert "of gradients (shared memory, " in out
    gloo = tmp_path / "gloo"
    out = cli("train", *SIX_STEPS_DDP, "--ddp_comm_hook", "none", "--output-dir", str(gloo), nproc=2).stdout
    assert "of gradients (gloo)" in out
    shm_weights = load_file(str(run / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))
    gloo_weights = load_file(str(gloo / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))
    assert _max_diff(shm_weights, gloo_weights) == 0.0

"""DDP over 2 processes is the same optimisation as 1 process with the global batch."""

from safetensors.torch import load_file

from conftest import QUIET, TINY
from distrinews.model import build_model

STEPS = 6
COMMON = [
    *TINY,
    "--dropout",
    "0.0",
    "--max_steps",
    str(STEPS),
    "--train_samples",
    "256",
    "--eval_samples",
    "64",
    "--learning_rate",
    "2e-3",
    "--warmup_ratio",
    "0",
    *QUIET,
    "--logging_steps",
    "2",
    # Equal to 1e-5 holds in fp32; bf16 autocast rounds differently in each layout (1e-3 apart).
    "--bf16",
    "false",
]


def _train(tmp_path, name, nproc, batch, accum, group, cli):
    out = tmp_path / name
    cli(
        "train",
        *COMMON,
        "--output-dir",
        str(out),
        "--per_device_train_batch_size",
        str(batch),
        "--gradient_accumulation_steps",
        str(accum),
        "--group_by_length",
        str(group).lower(),
        nproc=nproc,
    )
    return load_file(str(out / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_two_processes_equal_one_with_the_global_batch(tmp_path, agnews_dir, cli):
    """Length-grouped and plain sampling; with accumulation for both, without it for the grouped one."""
    init = build_model("tiny-random", dropout=0.0, seed=42).state_dict()
    for group, per_rank in ((True, ((8, 1), (4, 2))), (False, ((4, 2),))):
        single = _train(tmp_path, f"single-{group}", None, 16, 1, group, cli)
        assert _max_diff(single, {k: init[k] for k in single}) > 1e-3, "training must move the weights"
        for batch, accum in per_rank:
            ddp = _train(tmp_path, f"ddp-{group}-{batch}x{accum}", 2, batch, accum, group, cli)
            assert _max_diff(single, ddp) < 1e-5, (group, batch, accum)

"""DDP over 2 processes is the same optimisation as 1 process with the global batch.

Equal weights after a few steps prove less than they seem: AdamW divides each update by the root of the gradient's
running square, so a gradient scaled by a constant moves the weights the same but for ``eps``, and clipping at
``max_grad_norm`` rescales it once more. A gradient averaged wrong by a factor of two would pass a weights-only
comparison. So every step's loss and gradient norm (before clipping: ``log.jsonl``) and every evaluation are compared
too, over two epochs (``SIX_STEPS``: the second epoch's order is drawn anew); and the comparison is shown to fail on
the same log with its gradient norms doubled.
"""

import json
import math

import pytest
from safetensors.torch import load_file

from conftest import SIX_STEPS, SIX_STEPS_DDP
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import build_model

STEPS = 6
EPOCH_END = 3  # 48 rows of 16 a step
WEIGHTS_ATOL = 1e-5
# The same rows' losses and gradients summed in another order (within a rank, then across ranks): fp32 rounding, a
# few parts in 1e7. A gradient averaged over the wrong count is off by tens of percent at least.
LOG_RTOL = 1e-5
COMPARED = {"train": ("loss", "accuracy", "grad_norm", "learning_rate"), "eval": ("loss", "accuracy", "macro_f1")}


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
        return six_steps_ddp[0]  # this very run, done once for the session: test_fsdp compares FSDP with it too
    out = tmp_path / name
    cli("train", *SIX_STEPS, "--output-dir", str(out), *_layout(batch, accum, group), nproc=nproc)
    return out


def _weights(run):
    return load_file(str(run / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))


def _log(run) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def log_differences(one: list[dict], other: list[dict]) -> list[str]:
    """Where two runs' logs tell of different optimisations: each step's loss, accuracy, gradient norm and learning
    rate, and each evaluation, beyond ``LOG_RTOL``; empty when they agree."""

    def keyed(log):
        return {(r["kind"], r["step"]): r for r in log if r["kind"] in COMPARED}

    a, b = keyed(one), keyed(other)
    if a.keys() != b.keys():
        return [f"logged at other steps: {sorted(a)} and {sorted(b)}"]
    return [
        f"{kind} step {step} {field}: {a[kind, step].get(field)} and {b[kind, step].get(field)}"
        for kind, step in sorted(a)
        for field in COMPARED[kind]
        if not (
            isinstance(x := a[kind, step].get(field), float)
            and isinstance(y := b[kind, step].get(field), float)
            and math.isclose(x, y, rel_tol=LOG_RTOL, abs_tol=1e-9)
        )
    ]


def test_two_processes_equal_one_with_the_global_batch(tmp_path, cli, six_steps_ddp):
    """Length-grouped and plain sampling; with accumulation for both, without it for the grouped one. The same weights,
    and the same loss, gradient norm and evaluations at every step of both epochs."""
    init = build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=42).state_dict()
    for group, per_rank in ((True, ((8, 1), (4, 2))), (False, ((4, 2),))):
        single = _train(tmp_path, f"single-{group}", None, 16, 1, group, cli, six_steps_ddp)
        weights, log = _weights(single), _log(single)
        assert _max_diff(weights, {k: init[k] for k in weights}) > 1e-3, "training must move the weights"
        train = [r["step"] for r in log if r["kind"] == "train"]
        evals = [r["step"] for r in log if r["kind"] == "eval"]
        assert train == list(range(1, STEPS + 1)) and evals == [EPOCH_END, STEPS], "each step, two epochs"
        for batch, accum in per_rank:
            ddp = _train(tmp_path, f"ddp-{group}-{batch}x{accum}", 2, batch, accum, group, cli, six_steps_ddp)
            assert _max_diff(weights, _weights(ddp)) < WEIGHTS_ATOL, (group, batch, accum)
            assert not log_differences(log, _log(ddp)), (group, batch, accum, log_differences(log, _log(ddp)))


@pytest.mark.parametrize(
    ("mutation", "change"),
    [
        ("the gradient averaged x2", lambda r: {"grad_norm": 2 * r["grad_norm"]} if r["kind"] == "train" else {}),
        ("the gradient averaged x1/2", lambda r: {"grad_norm": r["grad_norm"] / 2} if r["kind"] == "train" else {}),
        ("one step's loss off by 1e-4", lambda r: {"loss": r["loss"] + 1e-4} if r["step"] == 5 else {}),
        ("an evaluation's accuracy", lambda r: {"accuracy": r["accuracy"] - 1 / 64} if r["kind"] == "eval" else {}),
    ],
)
def test_the_comparison_fails_on_a_wrong_scale(six_steps_ddp, mutation, change):
    """The comparison above, run on the session's DDP log against itself changed as a wrong average would change it:
    a gradient summed over the 2 ranks instead of averaged (x2), or divided by the world size twice (x1/2), shows in
    every step's gradient norm, whatever AdamW and clipping make of the weights (on this model a x2 moves them by
    ~2e-3, through the elements whose gradient is below AdamW's eps: an accident of the model, not a check)."""
    log = _log(six_steps_ddp[0])
    assert not log_differences(log, log)
    changed = [{**r, **change(r)} for r in log]
    found = log_differences(log, changed)
    assert found, mutation
    if "gradient" in mutation:
        assert [d.split(" grad_norm")[0] for d in found] == [f"train step {s}" for s in range(1, STEPS + 1)]


def test_shared_memory_average_is_gloos_bit_for_bit(tmp_path, cli, six_steps_ddp):
    """Two ranks on one host average through /dev/shm by default (ddp_comm_hook auto); the same run
    through gloo's all-reduce (ddp_comm_hook none) ends with the very same weights."""
    run, out = six_steps_ddp
    assert "of gradients (shared memory, " in out
    gloo = tmp_path / "gloo"
    out = cli("train", *SIX_STEPS_DDP, "--ddp_comm_hook", "none", "--output-dir", str(gloo), nproc=2).stdout
    assert "of gradients (gloo)" in out
    assert _max_diff(_weights(run), _weights(gloo)) == 0.0

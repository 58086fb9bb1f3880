"""The from-scratch track's lessons: their runs, and the numbers each page states, asserted on the run's output.

One ``Lesson`` per page; each ``Run`` is a command the page shows (its output lands in
docs/lessons/output/RUN.txt, which the page includes) with the check of what the page says about it.
"""

from __future__ import annotations

import re

from regenerate import TORCHRUN, Lesson, Output, Run, expect

CODE = "docs/lessons/code"
PARAMS = 676  # the track's model: Linear(16, 32), ReLU, Linear(32, 4)
STEPS = 12  # 3 epochs of 64 rows in global batches of 16


def _baseline(out: Output) -> None:
    losses = out.nums(r"process 0 of 1: epoch \d: loss on all 64 rows ([\d.]+)")
    expect(len(losses) == 3 and losses[0] > losses[1] > losses[2], "the loss falls every epoch", out)
    expect(out.has(rf"process 0 of 1: {STEPS} steps, 192 rows processed"), "12 steps, 192 rows", out)


def _baseline_twice(out: Output) -> None:
    for process in (0, 1):
        expect(out.has(rf"process {process} of 2: {STEPS} steps, 192 rows processed"), "each did all the work", out)
    checksums = out.nums(r"weight checksum (-?[\d.]+)")
    expect(len(checksums) == 2 and checksums[0] == checksums[1], "the two processes end with the same weights", out)
    first = out.nums(r"process 0 of 2: epoch \d: loss on all 64 rows ([\d.]+)")
    expect(first == out.nums(r"process 1 of 2: epoch \d: loss on all 64 rows ([\d.]+)"), "identical losses", out)


def _by_hand(averaged: bool):
    def check(out: Output) -> None:
        calls = 4 * STEPS if averaged else 0
        expect(out.num(r"all_reduce calls: (\d+)") == calls, f"{calls} all_reduce calls", out)
        sent = PARAMS * 4 * STEPS if averaged else 0
        expect(out.num(r"bytes all-reduced: ([\d,]+)") == sent, f"{sent:,} bytes", out)
        ranks = out.num(r"between the ranks' weights: ([\d.e+-]+)")
        single = out.num(r"from one process on all 16 rows: ([\d.e+-]+)")
        if averaged:
            expect(ranks == 0, "the replicas are identical", out)
            expect(single < 1e-6, "one process's weights, to float rounding", out)
        else:
            expect(ranks > 1e-2 and single > 1e-2, "the replicas drift apart, and from one process", out)

    return check


def _ddp(wrapped: bool):
    def check(out: Output) -> None:
        calls = STEPS if wrapped else 0
        expect(out.num(r"DDP all-reduces: (\d+) in 12 steps") == calls, f"{calls} all-reduces: one bucket a step", out)
        expect(out.num(r"in 12 steps, ([\d,]+) bytes") == calls * PARAMS * 4, "the same bytes as by hand", out)
        expect(out.num(r"\(by hand: (\d+)\)") == 4 * STEPS, "48 calls by hand", out)
        ranks = out.num(r"between the ranks' weights: ([\d.e+-]+)")
        hand = out.num(r"from the hand-written average: ([\d.e+-]+)")
        if wrapped:
            expect(ranks == 0 and hand == 0, "identical replicas, bit for bit the hand-written weights", out)
        else:
            expect(ranks > 1e-2 and hand > 1e-2, "no averaging: the replicas drift apart", out)

    return check


def _sampler(set_epoch: bool):
    def check(out: Output) -> None:
        expect(out.nums(r"rows on both ranks: (\d+)") == [0, 0, 0], "no row on both ranks in any epoch", out)
        expect(out.nums(r"rows seen: (\d+) of 12") == [12, 12, 12], "together the ranks see all 12 rows", out)
        distinct = out.num(r"distinct orders over 3 epochs: (\d+)")
        expect(distinct == (3 if set_epoch else 1), f"{3 if set_epoch else 1} distinct orders", out)
        odd = out.match(r"5 rows on 2 ranks: rank 0 \[(.*)\]   rank 1 \[(.*)\]")
        shards = [[int(i) for i in g.split(",")] for g in odd.groups()]
        expect([len(s) for s in shards] == [3, 3], "3 rows each from 5", out)
        expect(sorted(shards[0] + shards[1]) == [0, 0, 1, 2, 3, 4], "row 0 repeated as the padding", out)

    return check


def _no_sync(last_synced: bool):
    def check(out: Output) -> None:
        expect(out.has(r"^6 optimizer steps of 4 micro-batches per rank"), "6 steps of 4 micro-batches", out)
        plain = out.match(r"plain backward: (\d+) all-reduces, ([\d,]+) bytes; ranks differ by ([\d.e+-]+)")
        expect([float(g.replace(",", "")) for g in plain.groups()] == [24, 24 * PARAMS * 4, 0], "24 all-reduces", out)
        synced = out.match(r"no_sync on .*: (\d+) all-reduces, ([\d,]+) bytes; ranks differ by ([\d.e+-]+)")
        calls, sent, drift = (float(g.replace(",", "")) for g in synced.groups())
        differ = out.num(r"between the two ways' weights: ([\d.e+-]+)")
        if last_synced:
            expect(calls == 6 and sent == 6 * PARAMS * 4 and drift == 0, "6 all-reduces, a quarter", out)
            expect(differ < 1e-6, "the same weights, to float rounding", out)
        else:
            expect(calls == 0 and sent == 0, "nothing is ever averaged", out)
            expect(drift > 1e-2 and differ > 1e-2, "the replicas drift apart silently", out)

    return check


def _autocast(out: Output) -> None:
    expect(out.has(rf"^{PARAMS} parameters: {PARAMS * 4:,} bytes in fp32, {PARAMS * 2:,} in bf16"), "676", out)
    rows = {name: tuple(row) for name, *row in _runs(out)}
    expect(rows["fp32"] == ("float32", "float32", "float32", 4 * PARAMS * 4), "fp32 sends 10,816 bytes", out)
    expect(rows["bf16 autocast"] == ("float32", "bfloat16", "float32", 4 * PARAMS * 4), "autocast: the same", out)
    hooked = rows["bf16 autocast + bf16 hook"]
    expect(hooked == ("float32", "bfloat16", "float32", 4 * PARAMS * 2), "the bf16 hook halves it", out)
    expect(out.nums(r"updates lost to rounding: (\d+)") == [0, 0, 0], "fp32 weights lose no update", out)


def _pure_bf16(out: Output) -> None:
    _, *row = _runs(out)[0]
    expect(tuple(row) == ("bfloat16", "bfloat16", "bfloat16", 4 * PARAMS * 2), "bf16 everything, half the bytes", out)
    lost, updated = out.match(r"updates lost to rounding: (\d+) of (\d+)").groups()
    expect(int(lost) > int(updated) // 2, "most updates are lost to bf16's rounding", out)


PRECISION_RUN = re.compile(
    r"^(.+?): weights torch\.(\w+), activations torch\.(\w+), gradients torch\.(\w+)\n  all-reduced ([\d,]+) bytes",
    re.M,
)


def _runs(out: Output) -> list[tuple[str, str, str, str, int]]:
    """Each precision run's name, dtypes and bytes all-reduced."""
    found = PRECISION_RUN.findall(out.text)
    return [(n, w, a, g, int(b.replace(",", ""))) for n, w, a, g, b in found]


def _fp16(scaled: bool):
    def check(out: Output) -> None:
        expect(out.has(r"fp16 smallest above 0: 6\.0e-08; largest: 65,504"), "6e-8 and 65,504", out)
        zeroed = out.num(rf"rounded to 0 in fp16 \(not 0 in fp32\): (\d+) of {PARAMS}")
        error = out.num(r"largest gradient error against fp32: ([\d.]+)%")
        if scaled:
            expect(out.num(r"loss scale: ([\d.]+)") == 65536, "GradScaler starts at 65,536", out)
            expect(zeroed == 0 and error < 1, "no gradient lost, under 1% error", out)
        else:
            expect(zeroed > 10 and error > 5, "dozens of gradients round to 0, the rest are far off", out)

    return check


def _checkpoint(barrier: bool):
    def check(out: Output) -> None:
        expect(out.has(r"model\.state_dict\(\): \['module\.0\.weight'"), "the wrapper's keys start module.", out)
        expect(out.has(r"model\.module\.state_dict\(\): \['0\.weight'"), "the plain model's keys", out)
        expect(out.has(r"^rank 0: loaded 4 tensors, equal to the trained weights: True"), "rank 0 loads", out)
        if barrier:
            expect(out.has(r"^rank 1: loaded 4 tensors, equal to the trained weights: True"), "rank 1 loads", out)
        else:
            expect(out.has(r"^rank 1: FileNotFoundError"), "without the barrier rank 1 reads too early", out)

    return check


def _fsdp(per_layer: bool):
    def check(out: Output) -> None:
        model = out.num(r"model: ([\d.]+) MiB of fp32 parameters")
        expect(model == 1.008, "a 1.008 MiB model", out)
        for rank in (0, 1):
            ddp = out.match(rf"rank {rank} DDP : parameters ([\d.]+) MiB, gradients ([\d.]+) MiB, AdamW state ([\d.]+)")
            fsdp = out.match(
                rf"rank {rank} FSDP: parameters ([\d.]+) MiB, gradients ([\d.]+) MiB, AdamW state ([\d.]+)"
            )
            expect([float(g) for g in ddp.groups()] == [1.008, 1.008, 2.016], "DDP: everything on every rank", out)
            expect([float(g) for g in fsdp.groups()] == [0.504, 0.504, 1.008], "FSDP: half of each on each", out)
        expect(out.num(r"FSDP / DDP per rank: ([\d.]+)") == 0.5, "1/N of DDP's memory at N = 2", out)
        gathered = out.num(r"full parameters gathered at once in forward: ([\d.]+) MiB")
        expect(gathered == (0.251 if per_layer else model), "one layer at a time, or all of it", out)
        expect(out.num(r"FSDP's and DDP's weights after the step: ([\d.e+-]+)") == 0, "the same step", out)

    return check


def _short_trainer(out: Output) -> None:
    expect(out.has(r"^2 processes, 2,000 training rows, 63 steps of 16 x 2 rows$"), "63 steps of 32 rows", out)
    losses = out.nums(r"^epoch 0 step \d+/63 loss ([\d.]+)")
    expect(len(losses) == 4 and losses[2] < losses[0], "the loss falls from step 20 to step 60", out)
    accuracy = out.num(r"^test accuracy: ([\d.]+)% on 400 rows$")
    expect(accuracy > 50, "all 400 test rows counted once, far above chance (25%)", out)


def _lesson(name: str, page: str, file: str, flag: str, check, group_by: str | None = None) -> Lesson:
    """A lesson whose file runs under torchrun, as is and with the flag that breaks its idea."""
    command = f"{TORCHRUN} {CODE}/{file}"
    return Lesson(
        name,
        page,
        (Run(name, command, check(True)), Run(f"{name}-try", f"{command} {flag}", check(False))),
        code=(f"{CODE}/{file}",),
    )


LESSONS = [
    Lesson(
        "baseline",
        "baseline.md",
        (
            Run("baseline", f"python {CODE}/baseline.py", _baseline),
            # both processes print: not in the shared launch, their lines grouped by process
            Run(
                "baseline-try",
                f"{TORCHRUN} {CODE}/baseline.py",
                _baseline_twice,
                batch=False,
                group_by=r"^process (\d)",
            ),
        ),
        code=(f"{CODE}/baseline.py",),
    ),
    _lesson("by-hand", "all-reduce-by-hand.md", "allreduce_by_hand.py", "--skip-all-reduce", _by_hand),
    _lesson("ddp", "ddp-vs-dataparallel.md", "ddp.py", "--forward-unwrapped", _ddp),
    _lesson("sampler", "distributed-sampler.md", "sampler.py", "--no-set-epoch", _sampler),
    _lesson("no-sync", "buckets-and-no-sync.md", "no_sync.py", "--no-sync-last-too", _no_sync),
    Lesson(
        "autocast",
        "mixed-precision.md",
        (
            Run("autocast", f"{TORCHRUN} {CODE}/autocast.py", _autocast),
            Run("autocast-try", f"{TORCHRUN} {CODE}/autocast.py --pure-bf16", _pure_bf16),
            Run("fp16", f"{TORCHRUN} {CODE}/fp16_scaler.py", _fp16(True)),
            Run("fp16-try", f"{TORCHRUN} {CODE}/fp16_scaler.py --no-scaler", _fp16(False)),
        ),
        code=(f"{CODE}/autocast.py", f"{CODE}/fp16_scaler.py"),
    ),
    _lesson("checkpoint", "rank-zero-and-barrier.md", "checkpoint.py", "--skip-barrier", _checkpoint),
    _lesson("fsdp", "fsdp-vs-ddp-memory.md", "fsdp.py", "--root-only", _fsdp),
    Lesson(
        "short-trainer",
        "short-trainer.md",
        (
            Run(
                "short-trainer",
                f"TRAIN_ROWS=2000 TEST_ROWS=400 {TORCHRUN} examples/ddp_train.py",
                _short_trainer,
                timeout_s=1200,
                keep=r"^(\d+ processes|epoch \d+ step|training took|test accuracy)",
                batch=False,
                in_suite=False,  # MiniLM trains for minutes: tests/integration/test_short_trainer.py, a tiny model
            ),
        ),
        code=("examples/ddp_train.py",),
    ),
]

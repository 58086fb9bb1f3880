"""The concept lessons (the guide's ideas beyond the from-scratch track): their runs, and the numbers each page
states, asserted on the run's output. Timings are checked only by their order, where the order is the point."""

from __future__ import annotations

import re

from regenerate import TORCHRUN, Lesson, Output, Run, expect

CODE = "docs/lessons/code"
MINILM, DISTILBERT = 22_714_756, 66_956_548  # as transformers counts them (4 labels)


def _lesson(name: str, page: str, file: str, *runs: Run, more: tuple[str, ...] = ()) -> Lesson:
    return Lesson(name, page, runs, code=(f"{CODE}/{file}", *(f"{CODE}/{m}" for m in more)))


# ----------------------------------------------------------------------------------------------- why distribute
def _why(rows: int):
    def check(out: Output) -> None:
        params = out.nums(r"^\S.*: ([\d,]+) parameters, ")
        expect(params == [MINILM, DISTILBERT], "22,714,756 and 66,956,548 parameters, transformers' counts", out)
        expect(out.nums(r"= (\d+) MB$") == [363, 1071], "363 MB and 1,071 MB to train with Adam", out)
        expect(out.has(rf"one step, {rows} rows x 128 tokens per rank"), f"{rows} rows per rank", out)
        ratios = out.nums(r"communication/computation: ([\d.]+)")
        waits = out.nums(r"speedup on 2 devices: ([\d.]+)x if the all-reduce waits")
        if rows == 32:
            expect(ratios == [0.34, 0.25], "ratios 0.34 and 0.25", out)
            expect(waits == [1.49, 1.60], "1.49x and 1.60x without overlap", out)
        else:
            expect(all(r > 1 for r in ratios), "communication takes longer than compute", out)
            expect(all(w < 1 for w in waits), "two devices are slower than one", out)
        expect(out.has(r"7B parameters: 112 GB to train, 1\.4x an 80 GB device"), "7B does not fit", out)
        expect(out.has(r"86\.8 h on 1 device, 43\.4 h on 2, 10\.9 h on 8"), "the guide's 86.8 hours", out)

    return check


# ------------------------------------------------------------------------------------------ processes, groups
def _process_groups(claimed: int):
    def check(out: Output) -> None:
        for rank in (0, 1):
            expect(
                out.has(rf"^rank {rank}: RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0"),
                f"rank {rank}'s variables",
                out,
            )
        ports = out.nums(r"MASTER_PORT=(\d+)")
        expect(len(ports) == 2 and ports[0] == ports[1], "both ranks meet at one port", out)
        expect(out.has(r"backends built into this torch: gloo True, nccl False"), "gloo here, no NCCL", out)
        methods = ["env://", "file://", "TCPStore"] + (["tcp://"] if claimed == 2 else [])
        for method in methods:
            sums = out.nums(rf"^  {method}\s+rank \d of 2, backend gloo: all_reduce\(rank \+ 1\) = (\d+)")
            expect(sums == [3, 3], f"{method}: both ranks of 2, all_reduce gives 3", out)
        if claimed == 3:
            expect(
                out.has(r"tcp://    world_size=3 on 2 processes: DistStoreError: .*2/3 clients joined"),
                "world_size=3 waits for a third process that never comes",
                out,
            )

    return check


# ------------------------------------------------------------------------------------------------- collectives
COLLECTIVES = {  # name: (rank 0 after, rank 1 after), with rank 0 holding [1, 2] and rank 1 [3, 4]
    "broadcast(src=0)": ("[1, 2]", "[1, 2]"),
    r"reduce(dst=0, SUM)": ("[4, 6]", "-"),
    "all_reduce(SUM)": ("[4, 6]", "[4, 6]"),
    "all_reduce(AVG)": ("[2, 3]", "[2, 3]"),
    "all_reduce(PRODUCT)": ("[3, 8]", "[3, 8]"),
    "all_reduce(MIN)": ("[1, 2]", "[1, 2]"),
    "all_reduce(MAX)": ("[3, 4]", "[3, 4]"),
    "all_reduce(BAND)": ("[1, 0]", "[1, 0]"),
    "all_reduce(BOR)": ("[3, 6]", "[3, 6]"),
    "all_reduce(BXOR)": ("[2, 6]", "[2, 6]"),
    "all_gather": ("[[1, 2], [3, 4]]", "[[1, 2], [3, 4]]"),
    "reduce_scatter(SUM)": ("[4, 6]", "[40, 60]"),
    "scatter(src=0)": ("[10, 11]", "[20, 21]"),
    "gather(dst=0)": ("[[1, 2], [3, 4]]", "-"),
    "send(dst=1) / recv(src=0)": ("[1, 2]", "[1, 2]"),
    "all_reduce(group=[rank])": ("[1, 2]", "[3, 4]"),
    "all_reduce(async_op=True)": ("[4, 6]", "[4, 6]"),
}


def _after(out: Output, name: str) -> tuple[str, str]:
    line = out.match(rf"^{_escape(name)}\s+rank 0: .* -> (.*)   rank 1: .* -> (.*)$")
    return line.group(1), line.group(2)


def _escape(name: str) -> str:
    return "".join("\\" + c if c in "()[]|+.*?" else c for c in name)


def _collectives(blocking: bool):
    def check(out: Output) -> None:
        for name, after in COLLECTIVES.items():
            expect(_after(out, name) == after, f"{name} leaves {after}", out)
        if blocking:
            swap = _after(out, "send / recv (swap)")
            expect(swap == ("RuntimeError in send",) * 2, "both ranks fail in send: neither reaches recv", out)
        else:
            expect(_after(out, "isend / irecv (swap)") == ("[3, 4]", "[1, 2]"), "the ranks swap tensors", out)

    return check


# ------------------------------------------------------------------------------------- training and inference
def _train_infer(split: bool):
    def check(out: Output) -> None:
        expect(
            out.has(r"a training step through DDP \(forward, backward\): 1 allreduce_, 2 broadcast_$"),
            "training: 1 all-reduce of the gradients, 2 broadcasts of the buffers",
            out,
        )
        expect(
            out.has(r"inference through the DDP wrapper, eval and no_grad: 2 broadcast_$"),
            "the wrapper still broadcasts buffers in inference",
            out,
        )
        expect(out.has(r"inference with the plain module on each rank's rows: nothing$"), "no communication", out)
        rows = "[500, 500], 1000 predictions" if split else "[1000, 1000], 2000 predictions"
        expect(out.has(rf"rows per rank: {re.escape(rows)} for 1000 requests"), rows, out)
        expect(out.has(r"the ranks' answers equal one process's: True"), "the same answers as one process", out)
        expect(out.has(r"one request on 2 ranks: rows per rank \[1, 0\]"), "one request cannot be split", out)

    return check


# -------------------------------------------------------------------------------------------------- pipeline
def _pipeline(balanced: bool):
    def check(out: Output) -> None:
        idle = out.nums(r"^m=\d: step \d+ ms, idle ([\d.]+)")
        bubble = out.nums(r"GPipe's bubble \(p-1\)/\(m\+p-1\) = ([\d.]+)")
        expect(bubble == [0.5, 0.33, 0.2, 0.11], "the bubble formula gives 0.50, 0.33, 0.20, 0.11", out)
        steps = out.nums(r"^m=\d: step (\d+) ms")
        expect(steps[-1] < steps[0], "8 micro-batches take less time than 1", out)
        if balanced:
            expect(idle[0] >= 0.45, "one micro-batch: each rank idle half the step", out)
            expect(idle[0] > idle[1] > idle[2] and idle[3] < idle[1], "idle falls as m grows", out)
        else:
            expect(idle[-1] > bubble[-1] + 0.1, "an unbalanced pipeline idles far more than the formula", out)
        expect(out.has(r"sent per step: 8,192 B of activations forward"), "32 x 64 x 4 bytes each way", out)
        expect(out.has(r"gradients equal one process's on the whole batch: \[True, True\]"), "same gradients", out)

    return check


# ---------------------------------------------------------------------------------------- sync and async SGD
def _async(workers: int):
    def check(out: Output) -> None:
        runs = out.match(r"sync  SGD, lr 0.3, workers: (\d+), (\d+) updates from 96 gradients, staleness mean ([\d.]+)")
        expect(runs.groups() == (str(workers), str(96 // workers), "0.00"), "sync: fresh parameters", out)
        stale = out.nums(r"async SGD, lr [\d.]+, workers: \d+, 96 updates from 96 gradients, staleness mean ([\d.]+)")
        finals = [float(line.split(", ")[-1]) for line in out.text.splitlines() if "loss after" in line]
        if workers == 4:
            expect(stale == [2.94, 2.94] and out.nums(r"max (\d+)") == [0, 3, 3], "async staleness 3", out)
            expect(finals[1] > 1e6 and finals[0] < 1e-3, "async at lr 0.3 diverges where sync converges", out)
            expect(finals[2] < 1e-3, "async at a quarter of the lr converges", out)
        else:
            expect(stale == [0, 0], "one worker: no staleness", out)
            expect(finals[0] == finals[1], "one async worker is plain SGD", out)

    return check


def _stragglers(join: bool):
    def check(out: Output) -> None:
        fast = out.match(r"sleeps 0\.0 s per step: median step rank 0 (\d+) ms, rank 1 (\d+) ms")
        slow = out.match(r"sleeps 0\.1 s per step: median step rank 0 (\d+) ms, rank 1 (\d+) ms")
        expect(int(slow.group(1)) >= 100, "rank 0 waits for rank 1's 100 ms every step", out)
        expect(int(slow.group(1)) > int(fast.group(1)), "the straggler slows rank 0 down", out)
        expect(out.has(r"uneven inputs, rank 0: 3 of 3 batches done$"), "rank 0 finishes its 3 batches", out)
        if join:
            expect(out.has(r"uneven inputs, rank 1: 5 of 5 batches done$"), "join() lets rank 1 finish", out)
        else:
            expect(out.has(r"rank 1: 3 of 5 batches done, then RuntimeError: Timed out"), "rank 1 waits alone", out)

    return check


# --------------------------------------------------------------------------- comm ratio and the scaling rule
def _comm_ratio(out: Output) -> None:
    sent = out.nums(r"all-reduce of ([\d,]+) B")
    expect(sent == [4_210_704] * 3, "the same 4,210,704 B whatever the batch", out)
    ratios = out.nums(r"communication/computation ([\d.]+)")
    expect(ratios[0] > 5 * ratios[-1], "the ratio falls many times over from 4 to 512 rows", out)
    expect(out.has(r"the ratio falls as the batch per rank grows: True"), "the ratio falls", out)


def _lr_scaling(warmup: bool):
    def check(out: Output) -> None:
        losses = out.nums(r"loss ([\d.]+), accuracy")
        if warmup:
            expect(out.nums(r"(\d+) steps, loss") == [512, 64, 64, 32, 32], "512, 64 and 32 steps", out)
            base, same8, scaled8, same16, scaled16 = losses
            expect(same8 > 5 * base and same16 > 5 * base, "the same lr with a bigger batch falls far behind", out)
            expect(scaled8 < 1.5 * base, "lr x 8 with warmup nearly matches the baseline", out)
            expect(base < scaled16 < same16, "at x 16 the rule helps but no longer matches", out)
        else:
            expect(out.nums(r"(\d+) steps, loss") == [64, 32], "the two scaled runs only", out)
            expect(out.nums(r"warmup (\d+) steps") == [0, 0], "no warmup", out)
            expect(losses[1] > 1.5 * 0.434, "without warmup x 16 ends far worse (0.434 with it)", out)

    return check


# ------------------------------------------------------------------------------------------------- debugging
def _debugging(detail: bool):
    def check(out: Output) -> None:
        expect(out.has(r"default timeouts: gloo 0:30:00"), "gloo's default timeout is 30 minutes", out)
        if detail:
            expect(out.has(r"debug level: DebugLevel\.DETAIL"), "DETAIL", out)
            expect(
                out.has(r"Tensor Tensor shapes: 2vs 3$") and out.has(r"Tensor Tensor shapes: 3vs 2$"),
                "both ranks are told the shapes differ, 2 against 3",
                out,
            )
        else:
            expect(out.has(r"^rank 0, all_reduce of 2 elements: returned \[2\.0, 2\.0\]$"), "rank 0: no error", out)
            expect(
                out.has(r"^rank 1, all_reduce of 3 elements: RuntimeError: Timed out waiting 3000ms"),
                "rank 1 times out after 3 s, naming nothing",
                out,
            )
        expect(out.has(r"Rank 1 failed to pass monitoredBarrier in 1000 ms"), "monitored_barrier names rank 1", out)

    return check


# ----------------------------------------------------------------------------------------------- DDP options
def _ddp_options(find_unused: bool):
    def check(out: Output) -> None:
        blocks = dict(zip(out.text.splitlines()[0::3], out.text.splitlines()[1::3], strict=True))
        storages = out.nums(r"6 gradients in (\d+) storage")
        equal = [line.endswith("True") for line in out.text.splitlines()[2::3]]
        if find_unused:
            expect(
                blocks["find_unused_parameters=True:"].endswith("2 allreduce_, 2 broadcast_"),
                "find_unused_parameters: a second all-reduce every step",
                out,
            )
        else:
            expect(
                "RuntimeError: Expected to have finished reduction in the prior iteration"
                in blocks["defaults (find_unused_parameters=False):"],
                "the defaults fail on the second step",
                out,
            )
        expect(blocks["static_graph=True:"].endswith("1 allreduce_, 2 broadcast_"), "static_graph: one", out)
        expect(storages == [6, 6, 1, 6], "gradient_as_bucket_view: every gradient in the bucket's storage", out)
        expect(
            blocks["find_unused_parameters=True, forward_sync_buffers=False:"].endswith("2 allreduce_"),
            "forward_sync_buffers=False: no broadcast",
            out,
        )
        expect(equal == [True, True, True, False], "without syncing buffers the ranks' BatchNorm stats differ", out)

    return check


def _checkpointing(reentrant: bool):
    def check(out: Output) -> None:
        plain = out.match(r"plain: ([\d,]+) B of activations saved for backward, (\d+) block forwards")
        expect(plain.groups() == ("1,114,112", "8"), "1,114,112 B kept, each block run once", out)
        if reentrant:
            expect(out.has(r"checkpointed: RuntimeError: Expected to mark a variable ready only once$"), "fails", out)
        else:
            ckpt = out.match(r"checkpointed: ([\d,]+) B of activations saved for backward, (\d+) block forwards")
            expect(ckpt.groups() == ("589,824", "16"), "589,824 B kept, each block run twice", out)
            expect(out.has(r"the same gradients \(after DDP's all-reduce\): True"), "the same gradients", out)

    return check


# ------------------------------------------------------------------------------------- bandwidth and QLoRA
def _bandwidth(two_nodes: bool):
    def check(out: Output) -> None:
        expect(out.num(r"measured here, gloo .*: ([\d.]+) GB/s per link") > 0, "a bandwidth measured here", out)
        times = out.nums(r"all-reduce\s+([\d.]+) ms")
        expect(times[:2] == [0.35, 2.48], "0.35 ms on NVLink, 2.48 ms on PCIe", out)
        if two_nodes:
            expect(times[2:] == [3.41, 13.63], "3.41 ms over InfiniBand, 13.63 ms over Ethernet", out)
            expect(out.nums(r"([\d.]+)x the step's compute")[2:] == [1.29, 5.14], "longer than the compute", out)

    return check


def _qlora(full: bool):
    def check(out: Output) -> None:
        stored = out.num(r"model stored in ([\d,]+) B")
        sent = out.num(r"all-reduced per step: ([\d,]+) B")
        first, last = (float(g) for g in out.match(r"loss: ([\d.]+) at step 1, ([\d.]+) at step 20").groups())
        if full:
            expect(stored == sent == 4_202_496, "the whole fp32 model, stored and all-reduced", out)
        else:
            expect(stored == 1_196_032, "1,196,032 B: int8 weights, scales, biases, adapters", out)
            expect(sent == 131_072 and out.has(r"trainable: 32,768 parameters"), "only the adapters travel", out)
            expect(last < first / 2, "the adapters learn the low-rank change", out)

    return check


# ------------------------------------------------------------------------------------------------- formulas
def _formulas(out: Output) -> None:
    expect(out.has(r"N=2: 1\.000, N=4: 1\.500, N=8: 1\.750, N=16: 1\.875, N=64: 1\.969"), "2(N-1)/N", out)
    expect(
        out.has(r"rank 0 sent 4,096 B for a 4,096 B tensor \(1\.000x\); equals dist\.all_reduce: True"),
        "the hand ring sends 2(N-1)/N of the tensor and agrees with all_reduce",
        out,
    )
    per_param = out.nums(r"^  \S.*?\s+([\d.]+) B: MiniLM")
    expect(per_param == [16, 5.5, 3.75, 2], "16, 5.5, 3.75 and 2 bytes per parameter on 8 ranks", out)
    expect(out.nums(r"speedup ([\d.]+)x") == [1.71, 1.78, 1.78], "1.71x in total time, 1.78x per epoch", out)


LESSONS = [
    _lesson(
        "why-distribute",
        "why-distribute.md",
        "why_distribute.py",
        Run("why-distribute", f"{TORCHRUN} {CODE}/why_distribute.py", _why(32)),
        Run("why-distribute-try", f"{TORCHRUN} {CODE}/why_distribute.py --rows 4", _why(4)),
    ),
    _lesson(
        "process-groups",
        "process-groups.md",
        "process_groups.py",
        Run("process-groups", f"{TORCHRUN} {CODE}/process_groups.py", _process_groups(2)),
        Run("process-groups-try", f"{TORCHRUN} {CODE}/process_groups.py --world-size-3", _process_groups(3)),
    ),
    _lesson(
        "every-collective",
        "collectives.md",
        "collectives.py",
        Run("every-collective", f"{TORCHRUN} {CODE}/collectives.py", _collectives(False)),
        Run("every-collective-try", f"{TORCHRUN} {CODE}/collectives.py --blocking-swap", _collectives(True)),
    ),
    _lesson(
        "training-vs-inference",
        "training-vs-inference.md",
        "train_vs_infer.py",
        Run("train-infer", f"{TORCHRUN} {CODE}/train_vs_infer.py", _train_infer(True)),
        Run("train-infer-try", f"{TORCHRUN} {CODE}/train_vs_infer.py --same-rows", _train_infer(False)),
    ),
    _lesson(
        "pipeline",
        "model-and-pipeline-parallelism.md",
        "pipeline.py",
        Run("pipeline", f"{TORCHRUN} {CODE}/pipeline.py", _pipeline(True)),
        Run("pipeline-try", f"{TORCHRUN} {CODE}/pipeline.py --slow-stage-1", _pipeline(False)),
    ),
    _lesson(
        "async-sgd",
        "sync-and-async-sgd.md",
        "async_sgd.py",
        Run("async-sgd", f"{TORCHRUN} {CODE}/async_sgd.py", _async(4)),
        Run("async-sgd-try", f"{TORCHRUN} {CODE}/async_sgd.py --workers 1", _async(1)),
    ),
    _lesson(
        "stragglers",
        "stragglers.md",
        "stragglers.py",
        Run("stragglers", f"{TORCHRUN} {CODE}/stragglers.py", _stragglers(True)),
        Run("stragglers-try", f"{TORCHRUN} {CODE}/stragglers.py --no-join", _stragglers(False)),
    ),
    _lesson(
        "comm-ratio-and-lr-scaling",
        "comm-ratio-and-lr-scaling.md",
        "comm_ratio.py",
        Run("comm-ratio", f"{TORCHRUN} {CODE}/comm_ratio.py", _comm_ratio),
        Run("lr-scaling", f"{TORCHRUN} {CODE}/lr_scaling.py", _lr_scaling(True)),
        Run("lr-scaling-try", f"{TORCHRUN} {CODE}/lr_scaling.py --no-warmup", _lr_scaling(False)),
        more=("lr_scaling.py",),
    ),
    _lesson(
        "debugging",
        "debugging.md",
        "debugging.py",
        # The variable must be set before torch.distributed is imported: a launch of its own.
        Run(
            "debugging", f"TORCH_DISTRIBUTED_DEBUG=DETAIL {TORCHRUN} {CODE}/debugging.py", _debugging(True), batch=False
        ),
        Run("debugging-try", f"{TORCHRUN} {CODE}/debugging.py", _debugging(False)),
    ),
    _lesson(
        "ddp-options",
        "ddp-options.md",
        "ddp_options.py",
        Run("ddp-options", f"{TORCHRUN} {CODE}/ddp_options.py", _ddp_options(True)),
        Run("ddp-options-try", f"{TORCHRUN} {CODE}/ddp_options.py --no-find-unused", _ddp_options(False)),
    ),
    _lesson(
        "checkpointing",
        "activation-checkpointing.md",
        "checkpointing.py",
        Run("checkpointing", f"{TORCHRUN} {CODE}/checkpointing.py", _checkpointing(False)),
        Run("checkpointing-try", f"{TORCHRUN} {CODE}/checkpointing.py --reentrant", _checkpointing(True)),
    ),
    _lesson(
        "bandwidth",
        "bandwidth-hierarchy.md",
        "bandwidth.py",
        Run("bandwidth", f"{TORCHRUN} {CODE}/bandwidth.py", _bandwidth(False)),
        Run("bandwidth-try", f"{TORCHRUN} {CODE}/bandwidth.py --two-nodes", _bandwidth(True)),
    ),
    _lesson(
        "qlora",
        "qlora-on-cpu.md",
        "qlora_cpu.py",
        Run("qlora", f"{TORCHRUN} {CODE}/qlora_cpu.py", _qlora(False)),
        Run("qlora-try", f"{TORCHRUN} {CODE}/qlora_cpu.py --full", _qlora(True)),
    ),
    _lesson(
        "reference",
        "reference.md",
        "formulas.py",
        Run("formulas", f"{TORCHRUN} {CODE}/formulas.py", _formulas),
    ),
]

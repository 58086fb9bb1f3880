"""Lessons whose run is the product itself (a benchmark, the doctor) or docs/lessons/demo.py."""

from __future__ import annotations

from regenerate import Lesson, Output, Run, expect

DEMO = "python docs/lessons/demo.py"
DOCTOR_DROP = (
    r"python \d",
    r"CUDA ",
    r"CPU: ",
    r"GPU: ",
    r"backends: ",
    r"^distrinews doctor$",
    r"^What to do",
    r"no shared-memory",
)


def _collectives(out: Output) -> None:
    expect(out.has(r"^Correctness .*: all_reduce OK$"), "all_reduce is correct on both ranks", out)
    sizes = out.match(r"^\| (\S+ \S+) \|.*\n(?:\|.*\n)*\| (\S+ \S+) \|").groups()
    expect(sizes == ("4 KiB", "4 MiB"), "sizes from 4 KiB to 4 MiB", out)
    busbw = out.nums(r"^\| \d+ [KM]iB \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|$")
    algbw = out.nums(r"^\| \d+ [KM]iB \| [\d.]+ \| ([\d.]+) \|")
    expect(len(busbw) == 11 and busbw == algbw, "11 sizes; with 2 ranks the bus bandwidth is the algorithm's", out)
    expect(busbw[-1] > busbw[0], "4 MiB moves at a higher bandwidth than 4 KiB", out)


def _rendezvous(out: Output) -> None:
    expect(out.has(r"torchrun launched 2 processes"), "2 processes, one per node", out)
    expect(out.has(r"rendezvous of 2 processes \(gloo"), "the 2 processes meet", out)
    for op in ("all_reduce", "all_gather", "broadcast"):
        expect(out.has(rf"\[ OK \] {op} correct on every rank"), f"{op} correct across the two nodes", out)
    expect(out.has(r"^All checks passed\.$"), "all checks passed", out)


def _hung(out: Output) -> None:
    expect(out.has(r"started 1 of 2 ranks \(rendezvous timeout 3s\)"), "one of two ranks started", out)
    expect(out.has(r"\[FAIL\] .*'rendezvous'.*1/2 clients joined"), "the rendezvous fails with 1 of 2 there", out)
    expect(out.has(r"rank\(s\) 1 never joined the rendezvous"), "the missing rank is named", out)


def _lora(out: Output) -> None:
    total = out.num(r"minilm: ([\d.]+)M parameters")
    expect(round(total, 1) == 22.7, "22.7M parameters", out)
    expect(
        abs(out.num(r"all-reduce of ([\d.]+) MiB per step \(fp32\)") - total * 4e6 / 2**20) < 0.1, "4 bytes each", out
    )
    for r in (8, 16):
        share = out.num(rf"LoRA r={r} *: [\d.]+M trainable \(([\d.]+)%\)")
        expect(share < 1, f"LoRA r={r} trains under 1% of the weights", out)
    shares = out.nums(r"trainable \(([\d.]+)%\)")
    expect(abs(shares[1] - 2 * shares[0]) < 0.02, "r=16 trains twice r=8's adapter weights", out)


def _scaling(out: Output) -> None:
    speedups = out.nums(r"speedup ([\d.]+)x")
    efficiencies = out.nums(r"efficiency (\d+)%")
    for speedup, efficiency in zip(speedups, efficiencies):
        expect(abs(100 * speedup / 2 - efficiency) <= 1, "efficiency = speedup / 2 processes", out)
    expect(len(speedups) == 2, "one speedup each for strong and weak scaling", out)
    expect(out.has(r"^strong scaling \(128 rows per rank at 2\)"), "strong: 256 rows split, 128 per rank", out)
    expect(out.has(r"^weak scaling \(256 rows per rank at both\)"), "weak: 256 rows per rank", out)


LESSONS = [
    Lesson(
        "collectives",
        "all-reduce-ring.md",
        (
            Run(
                "collectives",
                "distrinews bench collectives --nproc 2 --ops all_reduce --min-bytes 4096 --max-bytes 4194304 "
                "--no-model --output-dir /tmp/distrinews-lesson",
                _collectives,
                keep=r"^(\||Correctness|###)",
                batch=False,
            ),
        ),
    ),
    Lesson("lora", "lora-payload.md", (Run("lora", f"{DEMO} lora", _lora),)),
    Lesson(
        "rendezvous",
        "multi-node-rendezvous.md",
        (
            Run(
                "rendezvous",
                "mkdir -p /tmp/distrinews-lesson\n"
                "distrinews doctor --nnodes 2 --node-rank 0 --nproc-per-node 1 --rdzv-endpoint 127.0.0.1:29731 "
                "--rdzv-id lesson --bandwidth-mb 1 > /tmp/distrinews-lesson/node0.log &\n"
                "distrinews doctor --nnodes 2 --node-rank 1 --nproc-per-node 1 --rdzv-endpoint 127.0.0.1:29731 "
                "--rdzv-id lesson --bandwidth-mb 1 > /tmp/distrinews-lesson/node1.log && wait $! && "
                "cat /tmp/distrinews-lesson/node0.log /tmp/distrinews-lesson/node1.log",
                _rendezvous,
                drop=(*DOCTOR_DROP, r"^\s*\d\. "),
            ),
        ),
    ),
    Lesson(
        "hung",
        "elastic-and-hung-ranks.md",
        (
            Run(
                "hung",
                "distrinews doctor --nproc 2 --start-ranks 1 --timeout 3",
                _hung,
                exit_code=1,
                drop=(*DOCTOR_DROP, r"free port found"),
            ),
        ),
    ),
    Lesson("scaling", "weak-and-strong-scaling.md", (Run("scaling", f"{DEMO} scaling", _scaling),)),
]

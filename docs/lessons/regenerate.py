"""Run every lesson's command and put what it prints into its page, between the page's markers:

    <!-- output: NAME -->
    ```text
    $ the command
    what it printed
    ```
    <!-- /output -->

    python docs/lessons/regenerate.py            # all lessons
    python docs/lessons/regenerate.py ddp nosync # some

tests/unit/test_lessons.py runs the same commands (``run``) and fails when one no longer runs or
its output's shape (``shape``: the lines with their numbers blanked) differs from the page's.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEMO = "python docs/lessons/demo.py"


@dataclass(frozen=True)
class Lesson:
    name: str  # the marker's name
    page: str  # under docs/lessons/
    command: str  # as the page shows it, run from the repository's root
    exit_code: int = 0
    # Only the lines that say the lesson's point: a machine's name, versions and paths would make the
    # output another machine's.
    keep: str = r".*"
    drop: tuple[str, ...] = field(default=())


DOCTOR_DROP = (
    *(
        r"python \d",
        r"CUDA ",
        r"CPU: ",
        r"GPU: ",
        r"backends: ",
        r"^distrinews doctor$",
        r"^What to do",
        r"no shared-memory",
    ),
    r"^\s*\d\. ",  # the advice (kept where it is the lesson)
)

LESSONS = [
    Lesson("ddp", "ddp-vs-dataparallel.md", f"{DEMO} ddp"),
    Lesson("sampler", "distributed-sampler.md", f"{DEMO} sampler"),
    Lesson(
        "collectives",
        "all-reduce-ring.md",
        "distrinews bench collectives --nproc 2 --ops all_reduce --min-bytes 65536 --max-bytes 4194304 --no-model "
        "--output-dir /tmp/distrinews-lesson-collectives",
        keep=r"^(\||Correctness|###)",
    ),
    Lesson("nosync", "buckets-and-no-sync.md", f"{DEMO} nosync"),
    Lesson("barrier", "rank-zero-and-barrier.md", f"{DEMO} barrier"),
    Lesson("precision", "mixed-precision.md", f"{DEMO} precision"),
    Lesson("fsdp", "fsdp-vs-ddp-memory.md", f"{DEMO} fsdp"),
    Lesson("lora", "lora-payload.md", f"{DEMO} lora"),
    Lesson(
        "rendezvous",
        "multi-node-rendezvous.md",
        "distrinews doctor --nnodes 2 --node-rank 0 --nproc-per-node 1 --rdzv-endpoint 127.0.0.1:29731 --rdzv-id lesson "
        "--bandwidth-mb 1 &\n"
        "distrinews doctor --nnodes 2 --node-rank 1 --nproc-per-node 1 --rdzv-endpoint 127.0.0.1:29731 --rdzv-id lesson "
        "--bandwidth-mb 1 >/dev/null; wait",
        drop=DOCTOR_DROP,
    ),
    Lesson(
        "hung",
        "elastic-and-hung-ranks.md",
        "distrinews doctor --nproc 2 --start-ranks 1 --timeout 3",
        exit_code=1,
        drop=(*DOCTOR_DROP[:-1], r"free port found"),
    ),
    Lesson("scaling", "weak-and-strong-scaling.md", f"{DEMO} scaling"),
]
BY_NAME = {lesson.name: lesson for lesson in LESSONS}
NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*")
TORCH_LOG = re.compile(r"^[WIE]\d{4} ")


def environment() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's python and distrinews
    return env


# What a page shows, and what a run uses instead: a port nobody else holds, a folder of its own (several
# engineers' test runs share a machine).
SHOWN_PORT = "29731"
SHOWN_DIR = "/tmp/distrinews-lesson-collectives"


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(lesson: Lesson, timeout: float = 120) -> str:
    """The lines the lesson's command prints (its kept lines), or AssertionError when it fails to run."""
    with tempfile.TemporaryDirectory(prefix="distrinews-lesson-") as scratch:
        command = lesson.command.replace(SHOWN_PORT, free_port()).replace(SHOWN_DIR, scratch)
        return _run(lesson, command, timeout)


def _run(lesson: Lesson, command: str, timeout: float) -> str:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != lesson.exit_code:
        why = f"{lesson.command!r} exited {done.returncode}, expected {lesson.exit_code}"
        raise AssertionError(f"{why}:\n{done.stdout}\n{done.stderr[-3000:]}")
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    lines = [line for line in lines if line and re.search(lesson.keep, line) and not TORCH_LOG.match(line)]
    lines = [line for line in lines if not any(re.search(d, line) for d in lesson.drop)]
    return "\n".join(lines)


def shape(text: str) -> list[str]:
    """The lines with every number blanked: what must not change when the timings do."""
    return [NUMBER.sub("#", line) for line in text.splitlines()]


def block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- output: {re.escape(name)} -->\n)(.*?)(<!-- /output -->)", re.S)


def page_output(lesson: Lesson) -> str:
    """The output the page shows for the lesson (without the command line)."""
    text = (HERE / lesson.page).read_text()
    match = block(lesson.name).search(text)
    if match is None:
        raise AssertionError(f"{lesson.page} has no <!-- output: {lesson.name} --> block")
    body = match.group(2).strip().removeprefix("```text").removesuffix("```").strip("\n")
    return "\n".join(line for line in body.splitlines() if not line.startswith("$ "))


def write(lesson: Lesson, output: str) -> None:
    path = HERE / lesson.page
    text = path.read_text()
    shown = "\n".join(f"$ {line}" for line in lesson.command.split("\n"))
    new = f"```text\n{shown}\n{output}\n```\n"
    text, count = block(lesson.name).subn(lambda m: m.group(1) + new + m.group(3), text)
    if count != 1:
        raise SystemExit(f"{lesson.page}: expected one <!-- output: {lesson.name} --> block, found {count}")
    path.write_text(text)


def main(names: list[str]) -> None:
    for name in names or list(BY_NAME):
        lesson = BY_NAME[name]
        output = run(lesson)
        write(lesson, output)
        print(f"{lesson.page}: {len(output.splitlines())} lines")


if __name__ == "__main__":
    main(sys.argv[1:])

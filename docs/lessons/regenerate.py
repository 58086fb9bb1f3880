"""Run every lesson and write what it printed to ``docs/lessons/output/RUN.txt``, the file its page includes.

    python docs/lessons/regenerate.py                 # every lesson
    python docs/lessons/regenerate.py sampler ddp     # some (a lesson's name or one run's)

A lesson is one page, its code (``docs/lessons/code/*.py``, included on the page) and its runs: the command
the page shows and, for "Try it", the same command with the flag that breaks the idea. Each run has a check:
the numbers its page states, asserted on what the run printed. This script refuses to write an output that
fails its check; ``tests/integration/test_lessons_run.py`` runs every lesson again and checks the fresh output the
same way, and that its lines are the page's (numbers aside: timings move). The lessons themselves are declared
in ``checks_*.py`` beside this file, each next to its checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUTPUT = HERE / "output"
CODE = HERE / "code"
TORCHRUN = "torchrun --nproc_per_node 2"
TORCH_LOG = re.compile(r"^[WIE]\d{4} ")  # c10d's and gloo's log lines: their times and pids are no lesson's
NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")


class Output:
    """What a run printed, with the look-ups a check needs; each fails naming what it did not find."""

    def __init__(self, text: str, run: str = "") -> None:
        self.text = text
        self.run = run

    def __str__(self) -> str:
        return self.text

    def match(self, pattern: str) -> re.Match[str]:
        found = re.search(pattern, self.text, re.M)
        if found is None:
            raise AssertionError(f"{self.run}: no line matches {pattern!r} in:\n{self.text}")
        return found

    def num(self, pattern: str) -> float:
        """The number the pattern's first group captures (commas allowed: 1,234)."""
        return float(self.match(pattern).group(1).replace(",", ""))

    def nums(self, pattern: str) -> list[float]:
        """Every match's first group, in order."""
        found = [float(m.group(1).replace(",", "")) for m in re.finditer(pattern, self.text, re.M)]
        if not found:
            raise AssertionError(f"{self.run}: no line matches {pattern!r} in:\n{self.text}")
        return found

    def word(self, pattern: str) -> str:
        return self.match(pattern).group(1)

    def has(self, pattern: str) -> bool:
        return re.search(pattern, self.text, re.M) is not None


def expect(condition: bool, claim: str, out: Output) -> None:
    """A check's assertion, readable outside pytest (regenerate.py runs the checks too)."""
    if not condition:
        raise AssertionError(f"{out.run}: the page says {claim!r}, the run does not show it:\n{out.text}")


@dataclass(frozen=True)
class Run:
    name: str  # its output file: docs/lessons/output/NAME.txt
    command: str  # as the page shows it, run from the repository's root by bash
    check: Callable[[Output], None]
    exit_code: int = 0
    timeout_s: float = 120.0
    # Lines to leave out: a machine's name, versions, paths and ports would make the output another machine's.
    drop: tuple[str, ...] = ()
    keep: str = r".*"
    # A torchrun run of one lesson file that exits 0 and prints only on rank 0 can share one torchrun launch
    # with the others in the test (start-up is most of a small lesson's time); one that must end the job, hang
    # until a timeout or set variables of its own runs alone.
    batch: bool = True
    # Several processes printing at once interleave their lines as the scheduler pleases: a regex whose first
    # group names a line's process (r"^process (\d+)") sorts the lines by it, each process's in its own order.
    group_by: str | None = None
    # False for a run too slow for the test suite (a real model's training): the unit test still checks its
    # committed output, and a test of its own runs the same file on something small.
    in_suite: bool = True

    def lesson_file(self) -> tuple[str, list[str]] | None:
        """(file, arguments) when the command is plain ``torchrun --nproc_per_node 2 FILE ARGS``."""
        if not self.command.startswith(TORCHRUN + " "):
            return None
        file, *args = self.command.removeprefix(TORCHRUN + " ").split()
        return file, args


@dataclass(frozen=True)
class Lesson:
    name: str
    page: str  # under docs/lessons/
    runs: tuple[Run, ...]
    code: tuple[str, ...] = field(default=())  # files the page includes, from the repository's root


def environment(torchrun: bool = True) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # this venv's torchrun
    if torchrun:
        # torchrun reads its flags from PET_* too: --standalone makes it pick a free port itself, so several
        # runs on one machine never meet at the default 29500, and the command stays the page's. Not for a
        # product command: it starts torchrun with a rendezvous of its own, which --standalone would replace.
        env["PET_STANDALONE"] = "1"
    return env


def clean(run: Run, stdout: str) -> str:
    lines = [line.rstrip() for line in stdout.splitlines()]
    lines = [line for line in lines if line and re.search(run.keep, line) and not TORCH_LOG.match(line)]
    lines = [line for line in lines if not any(re.search(d, line) for d in run.drop)]
    if run.group_by is not None:
        pattern = run.group_by
        lines.sort(key=lambda line: m.group(1) if (m := re.search(pattern, line)) else "")
    return "\n".join(lines)


# What a page shows, and what a run uses instead: a port nobody else holds, a folder of its own (several
# engineers' test runs share a machine).
SHOWN_PORT = "29731"
SHOWN_DIR = "/tmp/distrinews-lesson"


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def execute(run: Run) -> str:
    """What the run's command prints (cleaned), or AssertionError when it exits otherwise than expected."""
    with tempfile.TemporaryDirectory(prefix="distrinews-lesson-") as scratch:
        command = run.command.replace(SHOWN_PORT, free_port()).replace(SHOWN_DIR, scratch)
        code, stdout, stderr = _bash(command, environment("torchrun " in command), run.timeout_s)
    if code != run.exit_code:
        why = f"{run.command!r} exited {code}, expected {run.exit_code}"
        raise AssertionError(f"{why}:\n{stdout}\n{stderr[-3000:]}")
    return clean(run, stdout)


def _bash(command: str, env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """Runs in a session of its own, so that a timeout can end what the command started. torchrun starts each
    worker in a session of its own as well: SIGTERM first, which torchrun passes on to its workers, then
    SIGKILL for whatever is left of the command's own session."""
    with subprocess.Popen(
        ["bash", "-c", command],
        cwd=ROOT,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                stdout, stderr = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = "", "(its output was lost: a process it started still holds the pipes)"
            raise AssertionError(f"{command!r} ran past {timeout_s:.0f} s:\n{stdout}\n{stderr[-3000:]}") from None
    return process.returncode, stdout, stderr


def execute_batch(runs: Iterable[Run], timeout_s: float = 600.0) -> dict[str, str]:
    """Several lesson files' runs in one torchrun launch (docs/lessons/run_many.py): {run name: output}."""
    runs = list(runs)
    plan = []
    for run in runs:
        parsed = run.lesson_file()
        if parsed is None or not run.batch or run.exit_code:
            raise ValueError(f"{run.name} cannot share a launch: {run.command!r}")
        plan.append({"name": run.name, "file": parsed[0], "args": parsed[1]})
    with tempfile.TemporaryDirectory(prefix="distrinews-lessons-") as scratch:
        command = f"{TORCHRUN} {HERE / 'run_many.py'} {scratch} {shlex.quote(json.dumps(plan))}"
        code, stdout, stderr = _bash(command, environment(), timeout_s)
        if code:
            raise AssertionError(f"run_many.py exited {code}:\n{stdout}\n{stderr[-5000:]}")
        return {run.name: clean(run, (Path(scratch) / f"{run.name}.txt").read_text()) for run in runs}


def shown(run: Run, output: str) -> str:
    """The output file's text: the command as a reader types it, then what it printed."""
    command = "\n".join(f"$ {line}" for line in run.command.split("\n"))
    return f"{command}\n{output}\n"


def committed(run: Run) -> str:
    """What the page shows for the run (without the command)."""
    path = OUTPUT / f"{run.name}.txt"
    if not path.is_file():
        raise AssertionError(f"{path.relative_to(ROOT)} is missing: python docs/lessons/regenerate.py {run.name}")
    lines = path.read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("$ "))


def shape(text: str) -> list[str]:
    """The lines with every number blanked: what must not change when the timings do (the checks pin the rest)."""
    return [NUMBER.sub("#", line) for line in text.splitlines()]


def check(run: Run, output: str) -> None:
    run.check(Output(output, run.name))


def lessons() -> list[Lesson]:
    """Every lesson, from every checks_*.py beside this file, in file order."""
    found: list[Lesson] = []
    for path in sorted(HERE.glob("checks_*.py")):
        spec = importlib.util.spec_from_file_location(f"lesson_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        found += module.LESSONS
    return found


def runs_named(names: list[str]) -> list[Run]:
    every = lessons()
    if not names:
        return [run for lesson in every for run in lesson.runs]
    chosen = [run for lesson in every for run in lesson.runs if lesson.name in names or run.name in names]
    unknown = set(names) - {lesson.name for lesson in every} - {run.name for lesson in every for run in lesson.runs}
    if unknown:
        raise SystemExit(f"no lesson or run named {', '.join(sorted(unknown))}")
    return chosen


def main(names: list[str]) -> None:
    OUTPUT.mkdir(exist_ok=True)
    for run in runs_named(names):
        output = execute(run)
        check(run, output)  # a page must never show numbers that contradict what it says
        (OUTPUT / f"{run.name}.txt").write_text(shown(run, output))
        print(f"docs/lessons/output/{run.name}.txt: {len(output.splitlines())} lines")


if __name__ == "__main__":
    main(sys.argv[1:])

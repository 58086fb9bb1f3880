"""``distrinews bench batch``: labelling a corpus of files, our ways against the loop a user would write, in one run.

On one JSONL corpus of ``--rows`` AG News-style rows (``{"id", "text"}``, the test and training rows cycled),
with the checkpoint's default runtime:

- ``predict --nproc N`` for each N in ``--nproc`` (the local engine), and ``--engine ray`` with
  ``--ray-actors`` actors where Ray is installed;
- the obvious alternative: ``distrinews serve`` and a loop that posts the rows in batches of 64 to
  ``/predict/batch`` and writes the answers (what a user without the corpus form writes);
- memory: the peak resident set of the largest process of ``predict --nproc 1`` at each of ``--rss-rows``
  (constant memory: it must not grow with the corpus; ``--rss-checkpoint`` may name a faster model for the
  largest corpora, as the pipeline, not the model, is what is measured);
- resume: ``predict --nproc 2`` SIGKILLed once ``--kill-at`` of the rows are committed (read from its progress
  folder, so the kill lands mid-run however fast the machine is), then the same command again: the rows it found
  done, and the seconds the interruption cost in all.

Every command is a process of its own, timed from start to exit (model loading included, as a user waits for
it); its peak resident set is that of its largest process (``wait4``'s ``ru_maxrss``, which covers the
workers it waited for). Results: ``batch.json`` and ``batch.md`` in ``--output-dir``.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..options import Option
from ..options.shared import BENCH_OUTPUT_DIR, CHECKPOINT, DATA
from ..predict.batch.state import StateDir, state_dir_of
from .results import agnews_dir, report_head, write_report

POST_BATCH = 64
Rows = list[dict[str, Any]]  # the measured runs, in order, as the report holds them


OPTIONS = [
    CHECKPOINT,
    DATA,
    Option("rows", 100000, "rows of the corpus the engines are timed on", type=int),
    Option("nproc", "1,2", "comma-separated --nproc of the local engine"),
    Option("ray_actors", 2, "actors of --engine ray (0: skip Ray)", type=int),
    Option("no_server_loop", False, "skip the loop posting batches to distrinews serve", switch=True),
    Option("rss_rows", "10000,1000000", "comma-separated corpus sizes for peak memory (empty: skip)"),
    Option("rss_checkpoint", None, "the checkpoint of the memory runs (default: --checkpoint)"),
    Option("kill_at", 0.5, "resume: SIGKILL once this fraction of the rows is committed (0: skip)", type=float),
    Option("runtime", None, "--runtime of every engine (default: predict's and serve's)"),
    BENCH_OUTPUT_DIR,
    Option("name", "batch", "file name stem of the results"),
]


# ---------------------------------------------------------------------- the corpus
def write_corpus(path: Path, rows: int, data_dir: str | None) -> Path:
    """``rows`` JSONL rows ``{"id", "text"}``: AG News test and training texts (as the model sees them), cycled."""
    from ..data.splits import load_split

    data = agnews_dir(data_dir, "bench batch needs AG News for the rows of its corpus")
    texts = list(load_split(data, "test").texts) + list(load_split(data, "train").texts)
    with open(path, "w") as f:
        for i, text in zip(range(rows), itertools.cycle(texts)):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


# ---------------------------------------------------------------------- running and measuring a command
def run_measured(cmd: list[str], log: Path, kill_when: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Run ``cmd`` to its exit (or SIGKILL its process group once ``kill_when()`` says so): wall seconds, exit
    status, the peak resident set of its largest process (MiB), and its output."""
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        while kill_when is not None and proc.poll() is None:
            if kill_when():
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.002)  # a few manifest reads between two commits: the kill lands within a pass or two
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "seconds": time.monotonic() - started,
        "exit": proc.returncode,
        "peak_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux: the largest of it and the children it waited for
        "output": log.read_text(errors="replace"),
    }


def predict_command(checkpoint: str, corpus: Path, output: Path, runtime: str | None, *flags: str) -> list[str]:
    cmd = [sys.executable, "-m", "distrinews", "predict", "--checkpoint", checkpoint, "--input", str(corpus)]
    cmd += ["--output", str(output), "--id-field", "id", "--progress", "lines"]
    return [*cmd, *(["--runtime", runtime] if runtime else []), *flags]


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def server_loop(checkpoint: str, corpus: Path, output: Path, runtime: str | None, logs: Path) -> dict[str, Any]:
    """``distrinews serve``, then one client posting ``POST_BATCH`` rows at a time to /predict/batch, answers to
    JSONL."""
    from .serving_servers import start_server

    # port 0, at log level info: the listening line names the port it got (serving_servers.reported_port)
    cmd = [sys.executable, "-m", "distrinews", "serve", "--checkpoint", checkpoint, "--port", "0", "--no-access-log"]
    cmd += ["--runtime", runtime] if runtime else []
    started = time.monotonic()
    server = start_server("loop", cmd, "/ready", logs)
    ready = time.monotonic() - started
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        with open(corpus) as rows, open(output, "w") as out:
            while batch := [json.loads(line) for line in itertools.islice(rows, POST_BATCH)]:
                body = json.dumps({"texts": [r["text"] for r in batch]})
                conn.request("POST", "/predict/batch", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                answers = json.loads(response.read())
                if response.status != 200:
                    raise RuntimeError(f"/predict/batch answered {response.status}: {answers}")
                for row, a in zip(batch, answers, strict=True):
                    out.write(json.dumps({"id": row["id"], "label": a["label"], "confidence": a["confidence"]}) + "\n")
        conn.close()
        server_rss = _rss_mib(server.proc.pid)
    finally:
        server.stop()
    seconds = time.monotonic() - started
    return {"seconds": seconds, "ready_s": ready, "exit": 0, "peak_rss_mib": server_rss, "output": ""}


def _rss_mib(pid: int) -> float:
    """A live process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------------- the run
def run(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        from ..config import ConfigError

        raise ConfigError(f"bench batch: unexpected arguments: {' '.join(extra)}")
    for checkpoint in {args.checkpoint, args.rss_checkpoint} - {None}:  # before anything runs, as predict would say it
        if not Path(checkpoint).exists():
            raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)  # an unwritable folder fails now, not after the runs
    work = Path(tempfile.mkdtemp(prefix="distrinews-bench-batch-"))
    print(f"corpora, outputs and logs in {work}", flush=True)
    checkpoint = str(args.checkpoint)
    corpus = write_corpus(work / f"corpus-{args.rows}.jsonl", args.rows, args.data)
    results: Rows = []
    _measure_engines(args, checkpoint, corpus, work, results)
    memory = _measure_memory(args, checkpoint, corpus, work, results)
    resume = _measure_resume(args, checkpoint, corpus, work, results)
    report = {
        **report_head("batch"),
        "checkpoint": checkpoint,
        "rss_checkpoint": args.rss_checkpoint or checkpoint,
        "runtime": args.runtime or "the default",
        "results": results,
        "memory": memory,
        "resume": resume,
    }
    write_report(report, args.output_dir, args.name, markdown, None)
    return 0


def _record(
    results: Rows, name: str, result: dict[str, Any], n: int, output: Path | None, **extra_fields: Any
) -> dict[str, Any]:
    """A measured run's row, added to ``results`` and printed as it ends; a run that failed ends the benchmark."""
    labelled = count_lines(output) if output is not None and output.is_file() else None
    row = {"engine": name, "rows": n, "labelled": labelled, "rows_per_s": n / result["seconds"], **extra_fields}
    row.update({k: v for k, v in result.items() if k != "output"})
    results.append(row)
    print(
        f"{name:<28} {n:>9,} rows  {result['seconds']:8.1f} s  {row['rows_per_s']:8.1f} rows/s  "
        f"peak RSS {result['peak_rss_mib']:7.0f} MiB  exit {result['exit']}",
        flush=True,
    )
    if result["exit"] != 0:
        raise SystemExit(f"bench batch: {name} failed (exit {result['exit']}):\n{result['output'][-3000:]}")
    return row


def _measure_engines(args: argparse.Namespace, checkpoint: str, corpus: Path, work: Path, results: Rows) -> None:
    """``predict --nproc N`` for each N, Ray's engine, and a loop posting to ``serve``, on the same corpus."""
    engines: list[tuple[str, str, list[str], dict[str, str]]] = [
        (f"predict --nproc {n}", f"local-{n}", ["--nproc", str(n)], {}) for n in _numbers(args.nproc)
    ]
    if args.ray_actors:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("Ray is not installed: --engine ray skipped (pip install 'distrinews[ray]')", flush=True)
        else:
            driver = {"rss_of": "the driver (Ray's actors are not its children)"}
            ray_flags = ["--engine", "ray", "--nproc", str(args.ray_actors)]
            engines.append((f"predict --engine ray ({args.ray_actors} actors)", "ray", ray_flags, driver))
    for name, stem, flags, extra in engines:
        output = work / f"{stem}.jsonl"
        cmd = predict_command(checkpoint, corpus, output, args.runtime, *flags)
        run = run_measured(cmd, work / f"{stem}.log")
        _record(results, name, run, args.rows, output, command=_shown(cmd, work), **extra)
    if not args.no_server_loop:
        output = work / "loop.jsonl"
        result = server_loop(checkpoint, corpus, output, args.runtime, work)
        command = "(bench/batch.py: server_loop)"
        _record(results, f"serve + a loop posting {POST_BATCH}", result, args.rows, output, command=command)


def _measure_memory(args: argparse.Namespace, checkpoint: str, corpus: Path, work: Path, results: Rows) -> Rows:
    """Peak RSS of ``predict --nproc 1`` over corpora of each ``--rss-rows`` size."""
    memory, sizes = [], _numbers(args.rss_rows)
    checkpoint = args.rss_checkpoint or checkpoint  # the memory runs' checkpoint
    if sizes:  # not measured: a first start may make the checkpoint's int8 model, which a later start only loads
        warm = write_corpus(work / "corpus-warm-up.jsonl", 8, args.data)
        run_measured(predict_command(checkpoint, warm, work / "warm-up.jsonl", args.runtime), work / "warm-up.log")
    for n in sizes:
        rss_corpus = corpus if n == args.rows else write_corpus(work / f"corpus-{n}.jsonl", n, args.data)
        output = work / f"rss-{n}.jsonl"
        cmd = predict_command(checkpoint, rss_corpus, output, args.runtime, "--nproc", "1")
        run = run_measured(cmd, work / f"rss-{n}.log")
        memory.append(
            _record(results, f"memory: predict --nproc 1, {n:,} rows", run, n, output, command=_shown(cmd, work))
        )
        rss_corpus.unlink() if rss_corpus != corpus else None
        output.unlink()
    return memory


def _measure_resume(
    args: argparse.Namespace, checkpoint: str, corpus: Path, work: Path, rows: Rows
) -> dict[str, Any] | None:
    """``predict --nproc 2`` killed once ``--kill-at`` of the rows are committed, then run again: what it cost."""
    uninterrupted = next((r for r in rows if r["engine"] == "predict --nproc 2"), None)
    if not (args.kill_at and uninterrupted):
        return None
    output = work / "resume.jsonl"
    cmd = predict_command(checkpoint, corpus, output, args.runtime, "--nproc", "2")
    state = StateDir(state_dir_of(output))
    target = max(1, int(args.kill_at * args.rows))
    killed = run_measured(cmd, work / "resume-killed.log", kill_when=lambda: state.committed_rows() >= target)
    done_at_kill = state.committed_rows()  # what the killed run left committed (0 had it finished first)
    again = run_measured(cmd, work / "resume-again.log")
    found = re.search(r"continuing: ([\d,]+) rows were done", again["output"])
    resume = {
        "killed_after_s": killed["seconds"],
        "rows_done_at_kill": done_at_kill,
        "rows_continued": int(found.group(1).replace(",", "")) if found else 0,  # what the second run took over
        "resumed_s": again["seconds"],
        "total_s": killed["seconds"] + again["seconds"],
        "uninterrupted_s": uninterrupted["seconds"],
        "cost_s": killed["seconds"] + again["seconds"] - uninterrupted["seconds"],
        "labelled": count_lines(output) if output.is_file() else None,
        "exit": again["exit"],
    }
    print(
        f"resume: {done_at_kill:,} rows were done at the kill; the interruption cost {resume['cost_s']:.1f} s in all",
        flush=True,
    )
    return resume


def _numbers(listed: str) -> list[int]:
    """A comma-separated list of whole numbers (``--nproc``, ``--rss-rows``); empty: none."""
    return [int(n) for n in str(listed).split(",") if n.strip()]


def _shown(cmd: list[str], work: Path) -> str:
    return " ".join(shlex.quote(a) for a in cmd[1:]).replace(str(work), "$WORK")


def markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    timed = [r for r in report["results"] if not r["engine"].startswith("memory")]
    base = next((r for r in timed if r["engine"].startswith("serve + a loop")), None)
    lines = [
        f"`{report['command']}` on {machine['cpu']} ({machine['cores_available']} cores), {report['date']}; "
        f"runtime: {report['runtime']}; every command timed from start to exit (model loading included).",
        "",
        "| engine | rows | seconds | rows/s | x the server loop | peak RSS (MiB) | rows written |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in timed:
        ratio = f"{r['rows_per_s'] / base['rows_per_s']:.2f}" if base else "—"
        rss = f"{r['peak_rss_mib']:.0f}" + (f" ({r['rss_of']})" if r.get("rss_of") else "")
        lines.append(
            f"| {r['engine']} | {r['rows']:,} | {r['seconds']:.1f} | {r['rows_per_s']:.1f} | {ratio} | "
            f"{rss} | {r['labelled'] if r['labelled'] is not None else '—'} |"
        )
    if report["memory"]:
        lines += ["", f"Peak memory of `predict --nproc 1` (checkpoint `{report['rss_checkpoint']}`):", ""]
        lines += ["| rows | seconds | peak RSS (MiB) |", "| ---: | ---: | ---: |"]
        lines += [f"| {m['rows']:,} | {m['seconds']:.1f} | {m['peak_rss_mib']:.0f} |" for m in report["memory"]]
        lines += [
            "",
            "(Each after a start that made the checkpoint's int8 model, "
            "if it had none: every measured start only loads it.)",
        ]
    if report["resume"]:
        r = report["resume"]
        lines += [
            "",
            f"Resume: `predict --nproc 2` SIGKILLed after {r['killed_after_s']:.1f} s, then the same command again: "
            f"{r['rows_done_at_kill']:,} rows were done at the kill; the second run took {r['resumed_s']:.1f} s; "
            f"{r['total_s']:.1f} s in all against {r['uninterrupted_s']:.1f} s uninterrupted (the interruption cost "
            f"{r['cost_s']:.1f} s: one more start and at most one forward pass per worker computed again); "
            f"{r['labelled']} rows written.",
        ]
    return "\n".join(lines) + "\n"

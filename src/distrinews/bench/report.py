"""What every benchmark writes: the machine it ran on, and the report as JSON + markdown + PNG."""

from __future__ import annotations

import contextlib
import json
import os
import platform
from pathlib import Path
from typing import Any, Callable


def machine_description() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = {"cpu": cpu, "cores_available": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def write_report(report: dict[str, Any], output_dir: str, name: str,
                 markdown: Callable[[dict[str, Any]], str], plot: Callable[[dict[str, Any], Path], bool | None]) -> Path:
    """``output_dir/name.{json,md,png}``; prints the markdown. ``plot`` returns False when matplotlib is missing."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / name
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    md = markdown(report)
    stem.with_suffix(".md").write_text(md)
    plotted = plot(report, stem.with_suffix(".png")) is not False
    print(md)
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if plotted else " (no PNG: matplotlib missing)"))
    return stem

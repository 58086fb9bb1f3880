"""What the recipe tests read from deploy/: the command every recipe runs, as deploy/README.md gives it,
and the launcher flags that carry the cluster layout. Shared by the static checks (tests/unit/test_recipes.py)
and the Slurm script's runs (tests/integration/test_slurm_recipe.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
README = DEPLOY / "README.md"
SBATCH = DEPLOY / "slurm" / "train.sbatch"

# Launcher flags that carry the cluster layout. The Kubeflow operators supply them as PET_*
# variables; only the Slurm script passes them on the command line.
LAYOUT_FLAGS = {
    "--nnodes",
    "--nproc-per-node",
    "--node-rank",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--max-restarts",
}


def strip_layout(argv: list[str]) -> list[str]:
    """argv without the layout flags and their values (``--flag value`` or ``--flag=value``)."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in LAYOUT_FLAGS:
            i += 1 if "=" in argv[i] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def option(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def readme_section() -> str:
    text = README.read_text()
    start = text.index("\n## Cluster recipes\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def readme_command() -> list[str]:
    """The fenced block under "### The command every recipe runs", as argv."""
    section = readme_section()
    after = section[section.index("\n### The command every recipe runs\n") :]
    block = re.search(r"```(?:sh|bash)?\n(.*?)```", after, re.DOTALL)
    assert block, "no code block under 'The command every recipe runs'"
    return shlex.split(block.group(1).replace("\\\n", " "))

"""deploy/Dockerfile keeps its invariants (read as text: no container engine needed).

Building and running the image is `make image-test` (minutes, outside `make test`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from distrinews.export.space import dockerfile
from distrinews.export.space.dockerfile import find, instructions

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def arg_defaults(text: str, before_first_from: bool = False) -> dict[str, str]:
    """``ARG name=default``: all of them, or only the global ones (usable in FROM)."""
    items = instructions(text)
    if before_first_from:
        items = items[: find(items, "FROM")[0][0]]
    args = {}
    for _, a in find(items, "ARG"):
        name, _, default = a.partition("=")
        args[name] = default.strip('"')
    return args


def pip_installs(text: str) -> list[list[str]]:
    return dockerfile.pip_installs(instructions(text))


def cpu_only_torch_problems(text: str) -> list[str]:
    """Each ``pip install`` naming torch must pin a ``+cpu`` build (only CPU wheels have that
    local version) from the PyTorch CPU index or a local wheel directory; and nothing else may
    install torch through a requirements file."""
    problems, torch_installs = [], 0
    args = arg_defaults(text)
    for words in pip_installs(text):
        specs = [w for w in words[1:] if not w.startswith("-") and re.match(r"torch\b", w)]
        if not specs:
            continue
        torch_installs += 1
        for spec in specs:
            if not re.fullmatch(r"torch==(\$\{TORCH_VERSION\}|[\d.]+)\+cpu", spec):
                problems.append(f"torch spec {spec!r} is not pinned to a +cpu build")
        sources = {words[i + 1] for i, w in enumerate(words[:-1]) if w in ("--index-url", "-i", "--find-links", "-f")}
        sources = {args.get(s[2:-1], s) if s.startswith("${") else s for s in sources}
        if not sources or not all(s == CPU_INDEX or s.startswith("/") for s in sources):
            problems.append(f"torch installed from {sorted(sources) or 'the default index'}, not the CPU index or a local wheel dir")
        if "--extra-index-url" in words:
            problems.append("torch install with --extra-index-url could reach a CUDA build")
    if torch_installs == 0:
        problems.append("no pip install of torch found")
    requirements = DOCKERFILE.parent / "requirements.txt"
    for line in requirements.read_text().splitlines():
        if re.match(r"\s*torch\b", line):
            problems.append(f"deploy/requirements.txt installs torch ({line.strip()}) from the default index")
    return problems


def user_problems(text: str) -> list[str]:
    items = instructions(text)
    cmd = find(items, "CMD")
    users = find(items, "USER")
    if not cmd:
        return ["no CMD"]
    before = [a for i, a in users if i < cmd[-1][0]]
    if not before:
        return ["no USER before CMD: the server would run as root"]
    if before[-1].split(":")[0] in ("root", "0"):
        return [f"the last USER before CMD is {before[-1]!r}"]
    return []


def healthcheck_problems(text: str) -> list[str]:
    checks = find(instructions(text), "HEALTHCHECK")
    if not checks:
        return ["no HEALTHCHECK"]
    args = checks[-1][1]
    if "CMD" not in args.split():
        return [f"HEALTHCHECK has no CMD: {args!r}"]
    if not re.search(r"/health\b", args):
        return ["HEALTHCHECK does not hit /health"]
    return []


def expose_problems(text: str) -> list[str]:
    ports = [p.split("/")[0] for _, a in find(instructions(text), "EXPOSE") for p in a.split()]
    return [] if "7860" in ports else [f"EXPOSE 7860 missing (exposed: {ports})"]


def base_image_problems(text: str) -> list[str]:
    args = arg_defaults(text, before_first_from=True)
    froms = find(instructions(text), "FROM")
    problems = []
    if args.get("BASE_IMAGE") != "python:3.11-slim":
        problems.append(f"ARG BASE_IMAGE default is {args.get('BASE_IMAGE')!r}, want python:3.11-slim")
    if not froms or froms[0][1].split()[0] not in ("${BASE_IMAGE}", "$BASE_IMAGE"):
        problems.append(f"FROM does not use BASE_IMAGE: {froms[0][1] if froms else None!r}")
    return problems


def cmd_problems(text: str) -> list[str]:
    cmds = find(instructions(text), "CMD")
    if not cmds:
        return ["no CMD"]
    try:
        argv = json.loads(cmds[-1][1])
    except ValueError:
        return [f"CMD is not exec form (a JSON array): {cmds[-1][1]!r}; the server would not be PID 1"]
    if argv[:2] != ["distrinews", "serve"] or "0.0.0.0" not in argv:
        return [f"CMD is {argv}, want distrinews serve --host 0.0.0.0"]
    return []


@pytest.fixture(scope="module")
def text() -> str:
    return DOCKERFILE.read_text()


CHECKS = [user_problems, healthcheck_problems, expose_problems, base_image_problems, cmd_problems, cpu_only_torch_problems]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_dockerfile_invariant(text, check):
    assert check(text) == []


def test_model_checkpoint_default(text):
    envs = " ".join(a for _, a in find(instructions(text), "ENV"))
    assert "MODEL_CHECKPOINT=/models/best" in envs


# Each check must fail when the Dockerfile loses its property (so the tests above mean something).
BREAKAGES = {
    "user_problems": [
        ("USER app\n", ""),
        ("USER app\n", "USER root\n"),
        ("USER app\n", "USER 0:0\n"),
    ],
    "healthcheck_problems": [
        ("HEALTHCHECK ", "# HEALTHCHECK "),
        ("/health'", "/ready'"),
    ],
    "expose_problems": [("EXPOSE 7860", "EXPOSE 8080")],
    "base_image_problems": [
        ("ARG BASE_IMAGE=python:3.11-slim", "ARG BASE_IMAGE=python:3.12-slim"),
        ("FROM ${BASE_IMAGE}", "FROM python:3.11-slim"),
    ],
    "cmd_problems": [
        ('CMD ["distrinews", "serve", "--host", "0.0.0.0"]', "CMD distrinews serve --host 0.0.0.0"),
        ('"--host", "0.0.0.0"', '"--host", "127.0.0.1"'),
    ],
    "cpu_only_torch_problems": [
        ('"torch==${TORCH_VERSION}+cpu"; else', '"torch==${TORCH_VERSION}"; else'),
        ('"torch==${TORCH_VERSION}+cpu"; fi', '"torch==${TORCH_VERSION}"; fi'),
        ('--index-url "${TORCH_INDEX_URL}"', ""),
        ("ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu", "ARG TORCH_INDEX_URL=https://pypi.org/simple"),
        ('--find-links /context/.whl "torch', '--extra-index-url https://pypi.org/simple --find-links /context/.whl "torch'),
        ("pip install -r /app/requirements.txt", "pip install torch -r /app/requirements.txt"),
        ("pip install -r /app/requirements.txt", "pip install 'torch>=2.4' && pip install -r /app/requirements.txt"),
        ("pip install -r /app/requirements.txt", "python3 -m pip install torch && pip install -r /app/requirements.txt"),
    ],
}


def _collapse(text: str) -> str:
    """The Dockerfile with continuations joined (single spaces), as BREAKAGES are written."""
    return re.sub(r"\s*\\\n\s*", " ", text)


@pytest.mark.parametrize(
    ("check", "old", "new"),
    [(c, old, new) for c in CHECKS for old, new in BREAKAGES[c.__name__]],
    ids=lambda v: v.__name__ if callable(v) else None,
)
def test_each_check_catches_its_breakage(text, check, old, new):
    source = _collapse(text)
    assert old in source, f"breakage {old!r} no longer matches the Dockerfile; update BREAKAGES"
    assert check(source) == []
    assert check(source.replace(old, new, 1)) != []


def unreadable_shell_problems(text: str) -> list[str]:
    """The checks read a RUN's shell by splitting it at ``&&``, ``;``, ``then`` ... and skip a part ``shlex``
    cannot split (e.g. a quote that spans a ``;``), so a ``pip install`` written there escapes every check."""
    runs = [args for _, args in find(instructions(text), "RUN")]
    written = [m.group(0).strip() for args in runs for m in re.finditer(r"\bpip3?\s+install\b[^;&|]*", args)]
    seen = len(pip_installs(text))
    return [] if seen == len(written) else [f"the checks read {seen} of the {len(written)} pip installs written: {written}"]


# Shell the checks cannot read, each hiding a pip install from them.
UNREADABLE = [
    # an environment marker: pip's own syntax, and a ';' inside quotes; an unpinned torch from the default index
    ('pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}+cpu";', "pip install \"torch; sys_platform == 'linux'\";"),
    ("pip install -r /app/requirements.txt", 'pip install -r "/app/requirements.txt'),
]


def test_the_checks_see_every_pip_install(text):
    assert pip_installs(text), "no pip install found: the comparison below would hold for nothing"
    assert unreadable_shell_problems(text) == []


@pytest.mark.parametrize(("old", "new"), UNREADABLE)
def test_a_pip_install_the_checks_cannot_read_is_caught(text, old, new):
    source = _collapse(text)
    assert old in source, f"{old!r} no longer matches the Dockerfile; update UNREADABLE"
    assert unreadable_shell_problems(source) == []
    assert unreadable_shell_problems(source.replace(old, new, 1)) != []

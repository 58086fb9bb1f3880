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


def pip_installs(text: str) -> list[list[str]]:
    return dockerfile.pip_installs(instructions(text))


# The checks the Space bundle's Dockerfile keeps too are the product's own (export/space/dockerfile.py);
# the ones below them are deploy/Dockerfile's alone (its base image, its CMD).
def user_problems(text: str) -> list[str]:
    return dockerfile.user_problems(instructions(text))


def healthcheck_problems(text: str) -> list[str]:
    return dockerfile.healthcheck_problems(instructions(text))


def expose_problems(text: str) -> list[str]:
    return dockerfile.expose_problems(instructions(text), 7860)


def cpu_only_torch_problems(text: str) -> list[str]:
    """Each ``pip install`` naming torch pins a ``+cpu`` build from the CPU index or a local wheel
    directory, and deploy/requirements.txt does not name torch."""
    requirements = (DOCKERFILE.parent / "requirements.txt").read_text()
    return dockerfile.torch_install_problems(instructions(text), "torch", requirements)


def base_image_problems(text: str) -> list[str]:
    args = dockerfile.arg_defaults(instructions(text), before_first_from=True)
    froms = find(instructions(text), "FROM")
    problems = []
    # A moving tag (python:3.11-slim) rebuilds on another Python or Debian: the default names a patch release and a
    # Debian release, and may add a digest.
    if not re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", args.get("BASE_IMAGE") or ""):
        problems.append(f"ARG BASE_IMAGE default is {args.get('BASE_IMAGE')!r}, want python:3.11.N-slim-bookworm")
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


CHECKS = [
    user_problems,
    healthcheck_problems,
    expose_problems,
    base_image_problems,
    cmd_problems,
    cpu_only_torch_problems,
]


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
        ("ARG BASE_IMAGE=python:3.11.11-slim-bookworm", "ARG BASE_IMAGE=python:3.12.8-slim-bookworm"),
        ("ARG BASE_IMAGE=python:3.11.11-slim-bookworm", "ARG BASE_IMAGE=python:3.11-slim"),
        ("ARG BASE_IMAGE=python:3.11.11-slim-bookworm", "ARG BASE_IMAGE=python:latest"),
        ("FROM ${BASE_IMAGE}", "FROM python:3.11.11-slim-bookworm"),
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
        (
            '--find-links /context/.whl "torch',
            '--extra-index-url https://pypi.org/simple --find-links /context/.whl "torch',
        ),
        ("pip install -r /app/requirements.txt", "pip install torch -r /app/requirements.txt"),
        ("pip install -r /app/requirements.txt", "pip install 'torch>=2.4' && pip install -r /app/requirements.txt"),
        (
            "pip install -r /app/requirements.txt",
            "python3 -m pip install torch && pip install -r /app/requirements.txt",
        ),
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
    return (
        []
        if seen == len(written)
        else [f"the checks read {seen} of the {len(written)} pip installs written: {written}"]
    )


# Shell the checks cannot read, each hiding a pip install from them.
UNREADABLE = [
    # an environment marker: pip's own syntax, and a ';' inside quotes; an unpinned torch from the default index
    (
        'pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}+cpu";',
        "pip install \"torch; sys_platform == 'linux'\";",
    ),
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

"""The bundle's Dockerfile, and the invariants it must keep (read as text: no container engine needed).

The image follows deploy/Dockerfile (``ARG BASE_IMAGE``, a venv, CPU-only inference libraries, a non-root user,
``EXPOSE 7860``, a HEALTHCHECK on ``/health``, an exec-form CMD so the server is PID 1 and drains on SIGTERM), except
that the model is inside (a Space has nothing to mount), the user is uid 1000 (what Docker Spaces run as) and the
server is the slim ``python -m distrinews.serve``. Only the ``torch`` runtime installs torch: its ``+cpu`` build, from
a wheel in ``.whl/`` of the build context when there is one, else the PyTorch CPU index.
"""

from __future__ import annotations

import json
import re
import shlex
import sys

from . import MODEL_DIR, MODEL_FILES, PORT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SPACE_UID = 1000  # Docker Spaces run the container as uid 1000 (huggingface.co/docs/hub/spaces-sdks-docker)

# deploy/Dockerfile's: a request to /health from inside the container (the slim base has no curl).
HEALTHCHECK_CMD = (
    r"""python -c "import os, urllib.request; """
    r"""urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\", \"7860\")}/health', """
    r"""timeout=4)" || exit 1"""
)
_PIP_CERT = "if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi"


def server_command(runtime: str) -> list[str]:
    """The CMD: paths are relative to the bundle (the image's WORKDIR /app), so it runs the same outside a container."""
    command = ["python", "-m", "distrinews.serve", "--host", "0.0.0.0", "--checkpoint", MODEL_DIR]
    if runtime in ("onnx", "onnx-int8"):
        command += ["--runtime", "onnx", "--onnx-model", f"{MODEL_DIR}/{MODEL_FILES[runtime]}"]
    else:  # the bundle's runtime is fixed at export: never the first-start int8 making of --runtime auto
        command += ["--runtime", runtime]
    return command


def render(runtime: str, torch_version: str | None = None, base_image: str | None = None) -> str:
    # By default python:3.X-slim of the Python this export runs on: the pins were resolved for it.
    lines = _base_layers(runtime, base_image or f"python:{sys.version_info.major}.{sys.version_info.minor}-slim")
    if runtime == "torch":
        if not torch_version:
            raise ValueError("the torch runtime needs the torch version to pin")
        lines += _torch_layer(torch_version)
    lines += _server_layers(runtime)
    return "\n".join(lines) + "\n"


def _base_layers(runtime: str, base_image: str) -> list[str]:
    """The header comment, the base image, the environment and the virtualenv."""
    return [
        f"# A DistriNews text classifier: a Hugging Face Docker Space (runtime {runtime}).",
        "# Written by `distrinews export --format space`; the image design of DistriNews' deploy/Dockerfile:",
        "# non-root, HEALTHCHECK on /health, port 7860, CPU-only inference libraries, the model inside.",
        "#",
        "#   docker build -t distrinews-space . && docker run --rm -p 7860:7860 distrinews-space",
        "#",
        "# BASE_IMAGE: any Debian-like image with python3 and its venv module, of the Python the",
        "# requirements were pinned on. RUN --mount needs BuildKit (docker's default builder, the Hub's",
        "# builder) or podman/buildah. Optional build secret pip_cert: a CA bundle pip should trust.",
        f"ARG BASE_IMAGE={base_image}",
        "FROM ${BASE_IMAGE}",
        "",
        "ENV PYTHONDONTWRITEBYTECODE=1 \\",
        "    PYTHONUNBUFFERED=1 \\",
        "    PIP_NO_CACHE_DIR=1 \\",
        "    PIP_DISABLE_PIP_VERSION_CHECK=1 \\",
        "    HF_HUB_OFFLINE=1 \\",
        "    TOKENIZERS_PARALLELISM=false",
        "",
        "RUN python3 -m venv /opt/venv",
        "ENV PATH=/opt/venv/bin:$PATH",
        "",
    ]


def _torch_layer(torch_version: str) -> list[str]:
    return [
        f"ARG TORCH_VERSION={torch_version}",
        f"ARG TORCH_INDEX_URL={CPU_INDEX}",
        '# CPU-only PyTorch, its own layer: the "+cpu" local version exists only for CPU wheels, so',
        "# neither source can resolve to a CUDA build. A wheel in .whl/ of the build context wins.",
        "RUN --mount=type=bind,target=/context \\",
        "    --mount=type=secret,id=pip_cert \\",
        f"    {_PIP_CERT} \\",
        ' && if ls /context/.whl/torch-"${TORCH_VERSION}"+cpu-*.whl >/dev/null 2>&1; then \\',
        '        pip install --find-links /context/.whl "torch==${TORCH_VERSION}+cpu"; \\',
        "    else \\",
        '        pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}+cpu"; \\',
        "    fi",
        "",
    ]


def _server_layers(runtime: str) -> list[str]:
    """The server's pinned dependencies, the code and the model as a non-root user, the port, health and command."""
    return [
        "# The server's dependencies, pinned (no torch in this file: see above).",
        "COPY requirements.txt /tmp/requirements.txt",
        "RUN --mount=type=secret,id=pip_cert \\",
        f"    {_PIP_CERT} \\",
        " && pip install -r /tmp/requirements.txt",
        "",
        f"RUN useradd --create-home --uid {SPACE_UID} --shell /usr/sbin/nologin user",
        "WORKDIR /app",
        "COPY --chown=user:user distrinews /app/distrinews",
        f"COPY --chown=user:user {MODEL_DIR} /app/{MODEL_DIR}",
        "USER user",
        "",
        f"ENV PORT={PORT} \\",
        "    HOME=/home/user",
        f"EXPOSE {PORT}",
        "",
        "# Liveness from inside the container (the slim base has no curl).",
        "HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \\",
        "  CMD " + HEALTHCHECK_CMD,
        "",
        "# exec form: the server is PID 1 and receives SIGTERM itself (it drains, then exits 0).",
        f"CMD {json.dumps(server_command(runtime))}",
    ]


# ------------------------------------------------------------------ reading it back
def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, backslash continuations joined."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or not (line or pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            out.append((keyword.upper(), args.strip()))
    return out


def find(items: list[tuple[str, str]], keyword: str) -> list[tuple[int, str]]:
    """(position, arguments) of every ``keyword`` instruction."""
    return [(i, args) for i, (k, args) in enumerate(items) if k == keyword]


def cmd_argv(text: str) -> list[str] | None:
    """The exec-form CMD as a list, or None when there is none or it is shell form."""
    cmds = find(instructions(text), "CMD")
    try:
        argv = json.loads(cmds[-1][1] if cmds else "null")
    except ValueError:
        return None
    return argv if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None


def pip_installs(items: list[tuple[str, str]]) -> list[list[str]]:
    """Every ``pip install`` in every RUN (``--mount`` options dropped), as words from ``install`` on; a part of a RUN
    whose shell syntax ``shlex`` cannot split (an unclosed quote) is left out."""
    found = []
    for _, args in find(items, "RUN"):
        for part in re.split(r"&&|\|\||;|\bthen\b|\belse\b|\bfi\b", re.sub(r"^(--\S+\s+)+", "", args)):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":  # pip, pip3, python -m pip
                    found.append(words[i + 1 :])
    return found


def problems(text: str, runtime: str) -> list[str]:
    """What keeps this Dockerfile from being a safe, CPU-only, non-root Space image (empty when none)."""
    items = instructions(text)
    found: list[str] = []
    froms = find(items, "FROM")
    base = froms[0][1].split()[0] if froms else ""
    if base not in ("${BASE_IMAGE}", "$BASE_IMAGE") or "BASE_IMAGE" not in arg_defaults(items, True):
        found.append("FROM must use ARG BASE_IMAGE (declared before it)")
    found += user_problems(items) + healthcheck_problems(items) + expose_problems(items, PORT)
    argv = cmd_argv(text)
    if argv is None:
        found.append("CMD is missing or not exec form (a JSON array): the server would not be PID 1")
    elif argv[1:3] != ["-m", "distrinews.serve"] or "0.0.0.0" not in argv:
        found.append(f"CMD is {argv}, want python -m distrinews.serve --host 0.0.0.0 ...")
    return found + torch_install_problems(items, runtime)


# Each check below is shared with deploy/Dockerfile's test (tests/unit/test_dockerfile.py).
def arg_defaults(items: list[tuple[str, str]], before_first_from: bool = False) -> dict[str, str]:
    """``ARG name=default`` (quotes removed): all of them, or only the global ones (usable in FROM)."""
    froms = find(items, "FROM")
    end = froms[0][0] if before_first_from and froms else len(items)
    defaults = {}
    for _, a in find(items[:end], "ARG"):
        name, _, default = a.partition("=")
        defaults[name.strip()] = default.strip().strip("\"'")
    return defaults


def user_problems(items: list[tuple[str, str]]) -> list[str]:
    cmds = find(items, "CMD")
    users = [a for i, a in find(items, "USER") if cmds and i < cmds[-1][0]]
    if not users:
        return ["no USER before CMD: the server would run as root"]
    if users[-1].split(":")[0] in ("root", "0"):
        return [f"the last USER before CMD is {users[-1]!r}: the server would run as root"]
    return []


def healthcheck_problems(items: list[tuple[str, str]]) -> list[str]:
    checks = find(items, "HEALTHCHECK")
    if not checks or "CMD" not in checks[-1][1].split() or not re.search(r"/health\b", checks[-1][1]):
        return ["no HEALTHCHECK whose CMD requests /health"]
    return []


def expose_problems(items: list[tuple[str, str]], port: int) -> list[str]:
    ports = [p.split("/")[0] for _, a in find(items, "EXPOSE") for p in a.split()]
    return [] if str(port) in ports else [f"EXPOSE {port} missing (exposed: {ports})"]


_SOURCES = ("--index-url", "-i", "--find-links", "-f")  # where pip may take torch from
# pip options whose next word is their value, not a requirement
_VALUED = {*_SOURCES, "--extra-index-url", "-r", "--requirement", "-c", "--constraint", "--target", "-t"}


def torch_install_problems(
    items: list[tuple[str, str]], runtime: str = "torch", requirements: str | None = None
) -> list[str]:
    """torch only for the torch runtime, and then only a pinned +cpu build from the CPU index or a
    local wheel dir; a requirements file (``requirements``, its text) must not name torch at all,
    since it installs from the default index, where torch is the multi-GB CUDA build."""
    found = []
    defaults = arg_defaults(items)
    torch_installs = 0
    for words in pip_installs(items):
        specs = [
            w
            for i, w in enumerate(words[1:], 1)
            if not w.startswith("-") and words[i - 1] not in _VALUED and re.match(r"torch\b", w)
        ]
        if not specs:
            continue
        torch_installs += 1
        if runtime != "torch":
            found.append(f"the {runtime} runtime must not install torch ({' '.join(words)})")
            continue
        for spec in specs:
            if not re.fullmatch(r"torch==(\$\{TORCH_VERSION\}|[\d.]+)\+cpu", spec):
                found.append(f"torch spec {spec!r} is not pinned to a +cpu build")
        sources = {words[i + 1] for i, w in enumerate(words[:-1]) if w in _SOURCES}
        sources = {defaults.get(s[2:-1], s) if s.startswith("${") else s for s in sources}
        if not sources or not all(s == CPU_INDEX or s.startswith("/") for s in sources):
            found.append(
                f"torch installed from {sorted(sources) or 'the default index'}, not the CPU index or a local wheel dir"
            )
        if "--extra-index-url" in words:
            found.append("torch installed with --extra-index-url, which could reach a CUDA build")
    if runtime == "torch" and torch_installs == 0:
        found.append("the torch runtime's Dockerfile installs no torch")
    for line in (requirements or "").splitlines():
        if re.match(r"\s*torch\b", line):
            found.append(f"the requirements file installs torch ({line.strip()}) from the default index")
    return found

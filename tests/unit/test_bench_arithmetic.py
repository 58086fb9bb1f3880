"""``distrinews bench``'s arithmetic: speedup/efficiency, bus-bandwidth factors, MFU and model FLOPs, the seed's
estimate."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from distrinews.bench import collectives, scaling_arithmetic
from distrinews.distributed import bandwidth
from distrinews.train import flops
from figures import assert_texts_apart, drawn_figures

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- scaling
def test_speedup_and_efficiency():
    assert scaling_arithmetic.speedup(180.0, 100.0) == pytest.approx(1.8)
    assert scaling_arithmetic.efficiency(1.8, 2) == pytest.approx(0.9)
    assert scaling_arithmetic.efficiency(3.0, 4, baseline_workers=2) == pytest.approx(1.5)  # ideal from 2 to 4 is 2x
    assert math.isnan(scaling_arithmetic.speedup(10.0, 0.0))


def test_summarize_uses_the_smallest_worker_count_as_baseline():
    points = [
        {"workers": 2, "samples_per_s": 93.0, "bucket_cap_mb": 25.0},
        {"workers": 1, "samples_per_s": 50.0, "bucket_cap_mb": None},
        {"workers": 4, "samples_per_s": 160.0, "bucket_cap_mb": 25.0},
    ]
    rows = {r["workers"]: r for r in scaling_arithmetic.summarize(points)}
    assert rows[1]["speedup"] == pytest.approx(1.0) and rows[1]["efficiency"] == pytest.approx(1.0)
    assert rows[2]["speedup"] == pytest.approx(1.86) and rows[2]["efficiency"] == pytest.approx(0.93)
    assert rows[4]["speedup"] == pytest.approx(3.2) and rows[4]["efficiency"] == pytest.approx(0.8)


def test_weak_and_strong_batches():
    assert [scaling_arithmetic.per_worker_batch("weak", 16, None, n) for n in (1, 2, 4)] == [16, 16, 16]
    assert [scaling_arithmetic.per_worker_batch("strong", 16, 64, n) for n in (1, 2, 4)] == [64, 32, 16]
    with pytest.raises(ValueError, match="divisible"):
        scaling_arithmetic.per_worker_batch("strong", 16, 30, 4)


def test_core_slices_are_disjoint_and_refuse_oversubscription():
    assert scaling_arithmetic.core_slices([0, 1, 2, 3], 2, 2) == [[0, 1], [2, 3]]
    assert scaling_arithmetic.core_slices([4, 5], 2, 1) == [[4], [5]]
    with pytest.raises(ValueError, match="need 4 cores"):
        scaling_arithmetic.core_slices([0, 1], 2, 2)


# ---------------------------------------------------------------------- collectives
def test_bus_bandwidth_factors_are_nccl_tests():
    assert bandwidth.bus_factor("all_reduce", 2) == pytest.approx(1.0)
    assert bandwidth.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bandwidth.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bandwidth.bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert bandwidth.bus_factor("broadcast", 8) == 1.0
    alg, bus = bandwidth.bandwidths("all_reduce", 1_000_000, 0.001, 4)
    assert alg == pytest.approx(1e9) and bus == pytest.approx(1.5e9)
    with pytest.raises(ValueError):
        bandwidth.bus_factor("gather", 2)


def test_message_sizes_cover_1kib_to_256mib():
    sizes = collectives.message_sizes(collectives.KIB, 256 * collectives.MIB)
    assert sizes[0] == 1024 and sizes[-1] == 256 * 2**20 and len(sizes) == 19
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))
    assert collectives.iterations_for(1024) == 50 and collectives.iterations_for(256 * 2**20) == 3


def test_seed_ratio_is_the_lesson_formula_as_written():
    # lesson 04: param_size = params * 4 bytes; flops = 6 * param_size * batch * 512; 100 GB/s; 100 TFLOP/s
    est = collectives.lesson_comm_comp_ratio(num_params=1_000_000, batch_size=32, world_size=2)
    assert est["comm_s"] == pytest.approx(2 * 1 / 2 * 4e6 / 100e9)
    assert est["comp_s"] == pytest.approx(6 * 4e6 * 32 * 512 / 100e12)
    assert est["ratio"] == pytest.approx(est["comm_s"] / est["comp_s"])
    corr = collectives.corrected_comm_comp_ratio(
        grad_bytes=8e6, train_flops=4e9, busbw=1e9, peak_flops=1e11, world_size=2
    )
    assert (
        corr["comm_s"] == pytest.approx(8e-3)
        and corr["comp_s"] == pytest.approx(0.04)
        and corr["ratio"] == pytest.approx(0.2)
    )


# ---------------------------------------------------------------------- MFU
def _bert(layers=4, hidden=64, heads=4, intermediate=256):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=128,
        num_labels=4,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return BertForSequenceClassification(cfg).eval()


def test_model_shape_excludes_embedding_tables():
    model = _bert()
    shape = flops.ModelShape.of(model)
    emb = (
        sum(p.numel() for p in model.bert.embeddings.word_embeddings.parameters())
        + sum(p.numel() for p in model.bert.embeddings.position_embeddings.parameters())
        + sum(p.numel() for p in model.bert.embeddings.token_type_embeddings.parameters())
    )
    assert shape.matmul_params == sum(p.numel() for p in model.parameters()) - emb
    assert (shape.num_layers, shape.hidden_size) == (4, 64)


def test_train_flops_formula():
    shape = flops.ModelShape(matmul_params=1000, num_layers=2, hidden_size=8)
    # two rows of 3 and 5 real tokens: 6 N (3 + 5) + 12 L d (9 + 25)
    assert shape.train_flops(8, 34) == 6 * 1000 * 8 + 12 * 2 * 8 * 34
    assert shape.forward_flops(8, 34) == pytest.approx(shape.train_flops(8, 34) / 3)
    frozen = flops.ModelShape(matmul_params=1000, num_layers=2, hidden_size=8, frozen_matmul_params=600)
    assert frozen.train_flops(8, 34) == (6 * 1000 - 2 * 600) * 8 + 12 * 2 * 8 * 34
    assert frozen.forward_flops(8, 34) == shape.forward_flops(8, 34)
    from distrinews.train.metrics import Counts

    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    counts = Counts.of_batch(
        torch.tensor(0.5), torch.zeros(2, 4), {"attention_mask": mask, "labels": torch.tensor([0, 1])}
    )
    assert (counts.tokens, counts.squared_lengths, counts.samples) == (8.0, 34.0, 2.0)


def test_forward_flops_match_a_flop_counter():
    """The formula against torch's own count of matmul FLOPs for one unpadded sequence."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _bert()
    T = 48
    ids = torch.randint(5, 1000, (1, T))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    counted = counter.get_total_flops()
    predicted = flops.ModelShape.of(model).forward_flops(T, T * T)
    # the formula charges the pooler and classifier for every token, torch counts them once: a few % high
    assert counted <= predicted <= 1.06 * counted


def _counted_train_flops(model: torch.nn.Module, tokens: int) -> int:
    """torch's count of one forward and backward pass of one row of ``tokens`` tokens."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(5, 1000, (1, tokens))
    counter = FlopCounterMode(display=False)
    with counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([1])).loss.backward()
    return counter.get_total_flops()


def test_train_flops_of_a_mostly_frozen_model_match_a_flop_counter():
    """LoRA-like: only the first layer's query projection trains, so the gradient flows through every
    layer but frozen weights get no weight gradient (4 FLOPs per parameter and token, not 6).
    Charging them 6 reported an MFU of 102% for a LoRA run."""
    model = _bert().train()
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("bert.encoder.layer.0.attention.self.query"))
    T = 48
    counted = _counted_train_flops(model, T)
    shape = flops.ModelShape.of(model)
    assert shape.frozen_matmul_params == shape.matmul_params - sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )
    predicted = shape.train_flops(T, T * T)
    assert 0.97 * counted <= predicted <= 1.08 * counted, (predicted, counted)


def test_train_flops_with_frozen_bottom_layers_match_a_flop_counter():
    """freeze_layers: the backward pass never reaches the frozen bottom, so its layers cost their forward alone
    (2 FLOPs per parameter and token, attention 4 T^2 d), not the 4 of a frozen weight the gradient flows through."""
    from distrinews.model import freeze_layers

    model = _bert().train()
    freeze_layers(model, 3)
    T = 48
    counted = _counted_train_flops(model, T)
    shape = flops.ModelShape.of(model)
    assert (shape.forward_only_layers, shape.frozen_matmul_params) == (3, 0)
    layer = sum(p.numel() for p in model.bert.encoder.layer[0].parameters())
    assert shape.forward_only_matmul_params == 3 * layer + sum(
        p.numel() for p in model.bert.embeddings.LayerNorm.parameters()
    )
    predicted = shape.train_flops(T, T * T)
    # a few % high, as for the whole model (the pooler), plus the lowest trained layer's query/key/value
    # projections, whose input needs no gradient either: 2 FLOPs a parameter and token more than they cost
    assert 0.97 * counted <= predicted <= 1.10 * counted, (predicted, counted)
    unfrozen = flops.ModelShape.of(_bert())
    assert (unfrozen.forward_only_layers, unfrozen.forward_only_matmul_params) == (0, 0)


def test_mfu_and_peaks():
    assert flops.mfu(model_flops=5e12, seconds=10.0, peak_flops_per_process=1e12, world_size=2) == pytest.approx(0.25)
    assert flops.mfu(1.0, 0.0, 1e12, 1) == 0.0
    assert flops.gpu_table_peak("NVIDIA H100 80GB HBM3", True) == pytest.approx(989e12)
    assert flops.gpu_table_peak("NVIDIA H200", True) == pytest.approx(989e12)
    assert flops.gpu_table_peak("NVIDIA H100 PCIe", True) == pytest.approx(756e12)
    assert flops.gpu_table_peak("NVIDIA A100-SXM4-80GB", False) == pytest.approx(19.5e12)
    assert flops.gpu_table_peak("Tesla T4", True) == pytest.approx(65e12)
    assert flops.gpu_table_peak("Some Future GPU", True) is None
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    measured = flops.measure_matmul_peak(torch.device("cpu"), torch.float32, size=128, repeats=2)
    assert measured > 0
    assert torch.equal(torch.rand(3), expected_next), "measuring the peak must not draw from the global RNG"


def test_peak_override(monkeypatch):
    monkeypatch.setenv(flops.PEAK_ENV, "2.5")
    flops.device_peak.cache_clear()
    try:
        peak = flops.peak_for(torch.device("cpu"), torch.bfloat16)
        assert peak.flops == pytest.approx(2.5e12) and flops.PEAK_ENV in peak.source
    finally:
        flops.device_peak.cache_clear()


def test_the_cpu_peak_is_the_best_this_machine_has_measured(monkeypatch, tmp_path):
    """A measurement taken while something else ran (half the rate) does not become the peak: MFU is against the best
    rate recorded here for the same CPU, torch, dtype and threads; another dtype or a damaged record starts afresh."""
    monkeypatch.setenv("DISTRINEWS_CACHE", str(tmp_path))
    monkeypatch.delenv(flops.PEAK_ENV, raising=False)
    rates = iter([100e9, 50e9, 200e9, 80e9, 30e9, 20e9])
    monkeypatch.setattr(flops, "measure_matmul_peak", lambda *args, **kwargs: next(rates))

    def peak(dtype=torch.float32):
        flops.device_peak.cache_clear()  # a new process measures again
        return flops.peak_for(torch.device("cpu"), dtype)

    try:
        seen = [peak(), peak(), peak()]
        assert [p.flops for p in seen] == [100e9, 100e9, 200e9]
        assert "the best of 3 measurement(s) here" in seen[-1].source and "float32" in seen[-1].source
        assert peak(torch.bfloat16).flops == 80e9  # its own record
        (tmp_path / flops.PEAKS_FILE).write_text("[not a record")
        assert peak().flops == 30e9
        record = json.loads((tmp_path / flops.PEAKS_FILE).read_text())
        assert [entry["flops"] for entry in record.values()] == [30e9]
        (key,) = record
        (tmp_path / flops.PEAKS_FILE).write_text(json.dumps({key: {"flops": 1e15, "runs": "many"}}))
        damaged = peak()  # a record this code did not write: the measurement alone, no crash
        assert damaged.flops == 20e9 and "the best of 1 measurement(s) here" in damaged.source
    finally:
        flops.device_peak.cache_clear()


def test_the_cpu_peak_record_follows_no_planted_link(monkeypatch, tmp_path):
    """The cache folder is not trusted: a link at the lock is neither followed nor truncated through, and a link at the
    record is not read (a planted record of a huge peak would make every MFU tiny)."""
    monkeypatch.setenv("DISTRINEWS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(flops.PEAK_ENV, raising=False)
    monkeypatch.setattr(flops, "measure_matmul_peak", lambda *args, **kwargs: 100e9)
    (tmp_path / "cache").mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("not the lock's to truncate")
    (tmp_path / "cache" / flops.PEAKS_FILE).with_suffix(".lock").symlink_to(victim)
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"any": {"flops": 1e18, "runs": 9}}))
    (tmp_path / "cache" / flops.PEAKS_FILE).symlink_to(planted)

    def peak():
        flops.device_peak.cache_clear()  # a new process measures again
        try:
            return flops.peak_for(torch.device("cpu"), torch.float32)
        finally:
            flops.device_peak.cache_clear()

    assert peak().flops == 100e9  # the measurement alone: the lock is refused
    assert victim.read_text() == "not the lock's to truncate"
    (tmp_path / "cache" / flops.PEAKS_FILE).with_suffix(".lock").unlink()
    recorded = peak()  # the planted record is not read, and is replaced by this run's, not written through
    assert recorded.flops == 100e9 and "the best of 1 measurement(s) here" in recorded.source
    assert json.loads(planted.read_text()) == {"any": {"flops": 1e18, "runs": 9}}
    assert not (tmp_path / "cache" / flops.PEAKS_FILE).is_symlink()


def test_cuda_peak_comes_from_the_table_by_device_name(monkeypatch):
    """The GPU branch without a GPU: the device name picks the datasheet figure for the precision."""
    monkeypatch.delenv(flops.PEAK_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-40GB")
    flops.device_peak.cache_clear()
    try:
        bf16 = flops.device_peak("cuda", 0, torch.bfloat16, 1)
        fp32 = flops.device_peak("cuda", 0, torch.float32, 1)
    finally:
        flops.device_peak.cache_clear()
    assert bf16.flops == pytest.approx(312e12) and "A100" in bf16.source and "datasheet" in bf16.source
    assert fp32.flops == pytest.approx(19.5e12)


def test_ddp_bucket_default_depends_on_the_device():
    from distrinews.config import TrainConfig
    from distrinews.distributed.parallel import ddp_bucket_cap_mb

    assert (
        ddp_bucket_cap_mb(TrainConfig().parallel, torch.device("cpu")) == 100.0
    )  # measured best on gloo (benchmarks/README.md)
    assert (
        ddp_bucket_cap_mb(TrainConfig().parallel, torch.device("cuda", 0)) == 25.0
    )  # torch's default where overlap pays
    assert ddp_bucket_cap_mb(TrainConfig(ddp_bucket_cap_mb=5).parallel, torch.device("cpu")) == 5.0


def test_scaling_rejects_bad_input_before_starting_workers(capsys):
    from distrinews.cli import main

    assert main(["bench", "scaling", "--nproc", "1,8", "--cores-per-worker", "4"]) == 2
    assert "need 32 cores" in capsys.readouterr().err
    configs = Path(__file__).resolve().parents[2] / "configs"
    assert (
        main(["bench", "scaling", "--nproc", "1,2", "--config", str(configs / "tiny.yaml"), "--ddp_comm_hook", "int4"])
        == 2
    )
    assert "ddp_comm_hook" in capsys.readouterr().err
    assert main(["bench", "scaling", "--nproc", "1,2", "--comm-hooks", "auto,int4"]) == 2
    assert "expected a comma-separated list of auto, none, shm, bf16, fp16, got 'auto,int4'" in capsys.readouterr().err
    assert main(["bench", "scaling", "--nproc", "1,2", "--repeat", "0"]) == 2
    assert "--repeat must be >= 1" in capsys.readouterr().err


def test_scaling_reports_each_points_median_run():
    from distrinews.bench.scaling import median_run
    from distrinews.bench.scaling_report import _samples

    runs = [{"samples_per_s": v, "step_ms": 1000 / v} for v in (30.0, 34.0, 31.0)]
    point = median_run(runs)
    assert point["samples_per_s"] == 31.0 and point["step_ms"] == 1000 / 31.0  # that run's other figures with it
    assert point["runs_samples_per_s"] == [30.0, 34.0, 31.0]  # in the order they ran
    assert median_run(runs[:2])["samples_per_s"] == 30.0  # even: the lower middle
    assert _samples(point) == "31.0 (30.0-34.0)" and _samples(median_run(runs[:1])) == "30.0"


def test_the_scaling_plot_draws_each_way_of_averaging_apart(tmp_path, monkeypatch):
    """Section 23's plot drew gloo and shared memory, both with 100 MB buckets at 2 workers, as one line through
    both points and as two bars under one label, its figures printed over one another."""
    from distrinews.bench.scaling_report import plot

    def point(workers, samples, allreduce=None, exposed=None):
        phases = {"data": 0.5, "forward_backward": 320.0 + 20 * workers, "optimizer": 15.0}
        return {
            "workers": workers,
            "baseline_workers": 1,
            "per_worker_batch": 16,
            "bucket_cap_mb": 100.0 if allreduce else None,
            "allreduce": allreduce,
            "ddp_comm_hook": None,
            "speedup": samples / 47.1,
            "efficiency": samples / 47.1 / workers,
            "phases_ms": phases,
            "exposed_allreduce_ms": exposed,
        }

    points = [point(1, 47.1), point(2, 79.2, "gloo", 41.8), point(2, 87.5, "shared memory, 34.4 MiB in /dev/shm", 21.0)]
    drawn = drawn_figures(monkeypatch)
    assert plot({"mode": "weak", "points": points}, tmp_path / "scaling.png")
    (fig,) = drawn
    speedup, phases = fig.axes
    assert [line.get_label() for line in speedup.get_lines()] == [
        "ideal",
        "measured, bucket 100 MB, gloo",
        "measured, bucket 100 MB, shared memory",
    ]
    labels = [t.get_text() for t in phases.get_xticklabels()]
    assert len(set(labels)) == 3 and "gloo" in labels[1] and "shared memory" in labels[2]
    assert_texts_apart(fig)


def test_the_default_runtime_rule_judges_runtimes_not_auto_and_names_what_auto_serves():
    from distrinews.bench.serving_runtimes import choose_default

    accuracy = [
        {"runtime": r, "accuracy": acc, "agreement_with_torch_fp32": 1.0, "changed_labels": 0, "seconds": 1.0}
        for r, acc in (
            ("torch", 0.9078),
            ("auto", 0.9076),
            ("onnx", 0.9078),
            ("onnx-int8", 0.9076),
            ("torch-bf16", 0.9040),
        )
    ]
    load = [
        {"server": "ours", "runtime": r, "texts": "full", "concurrency": c, "throughput_rps": rps, "p50_ms": 5.0}
        for r, rps in (("torch", 126.0), ("auto", 251.0), ("onnx", 153.0), ("onnx-int8", 249.0), ("torch-bf16", 300.0))
        for c in (1, 32)
    ]
    rule = choose_default(accuracy, load, 32)
    # auto's own row is faster in this run, but it is not a runtime; torch-bf16 is fastest but 0.38 points off fp32
    assert rule["runtime"] == "onnx-int8" and rule["throughput_rps"] == 249.0
    from distrinews.bench.serving_report import default_verdict

    report = {"default_runtime": "auto", "servers": {"ours-auto": {"runtime": "onnx-int8"}}}
    assert default_verdict("onnx-int8", report) == "what the default of `distrinews serve` serves here (auto)"
    assert default_verdict("onnx", report) == "not what the default (auto) serves here (onnx-int8)"


def test_the_limit_is_the_runtime_alone_plus_the_empty_responder_on_the_cores_the_clients_leave(monkeypatch):
    from distrinews.bench import serving_limit

    monkeypatch.setattr(serving_limit, "usable_cores", lambda: 2)
    row = {"texts": "full", "duration_s": 10.0}
    results = [
        {**row, "server": "ours", "runtime": "auto", "concurrency": 1, "p50_ms": 3.4, "throughput_rps": 290.0},
        {**row, "server": "ours", "runtime": "auto", "concurrency": 32, "p50_ms": 70.0, "throughput_rps": 600.0,
         "client_cpu_cores": 0.4},
        {**row, "server": "empty", "runtime": "-", "concurrency": 1, "p50_ms": 0.9, "throughput_rps": 1000.0},
        {**row, "server": "empty", "runtime": "-", "concurrency": 32, "p50_ms": 20.0, "throughput_rps": 3000.0,
         "client_cpu_cores": 0.9},
    ]  # fmt: skip
    alone = {"runtime": "onnx-int8", "threads": None, "max_batch_tokens": 512, "p50_ms": 2.2,
             "texts_per_s": {"1": 450.0, "8": 840.0}, "best_texts_per_s": 840.0}  # fmt: skip
    limit = serving_limit.summarise({"results": results}, alone, "auto", 32)
    assert limit["overhead_ms"] == pytest.approx(3.4 - 2.2 - 0.9)
    # 840 texts/s on 2 cores, of which the load generator took 0.4: 672 on the 1.6 left; ours did 600
    assert limit["runtime_scaled_texts_per_s"] == pytest.approx(672.0) and limit["share"] == pytest.approx(600 / 672)
    assert [a["passed"] for a in limit["aims"]] == [True, True]
    serving_limit.add_seed_aim({"limit": limit}, [{"runtime": "auto", "concurrency": 32, "throughput_ratio": 7.5}])
    assert limit["seed_ratio"] == 7.5 and limit["aims"][-1]["passed"] is False
    lines = serving_limit.markdown(limit)
    assert "## The limit (onnx-int8, what auto serves here)" in lines
    passed = "- PASS  p50 at 1 client within 0.5 ms of the runtime alone + the empty responder: 3.40 ms against 3.10 ms"
    assert f"{passed} (+0.30 ms)" in lines
    assert "- FAIL  at 32 clients at least 8x the seed-style server: 7.50x" in lines


def test_the_step_profile_puts_each_operator_in_its_group():
    from distrinews.bench.step_profile import group_of

    assert group_of("aten::addmm") == group_of("aten::mm") == "matrix products"
    assert group_of("aten::gelu_backward") == group_of("aten::native_layer_norm_backward") == "layer norm, GELU, tanh"
    assert group_of("aten::ge") == group_of("aten::bernoulli_") == group_of("_FastDropoutBackward") == "dropout"
    assert group_of("aten::linalg_vector_norm") == "gradient clipping (norms)"
    assert group_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention (fused kernels, softmax, masks)"
    assert group_of("aten::_fused_adamw_") == "optimizer (AdamW)"
    assert group_of("aten::add_") == "elementwise (add, mul, div, fill, sum)"
    assert group_of("autograd::engine::something") == "other (framework, autograd bookkeeping)"


def test_the_runtime_alone_forms_batches_from_no_more_texts_than_the_clients_keep_in_flight(monkeypatch):
    """At C clients the server's batcher never sees more than C texts, so the runtime alone may group lengths from
    no more: a window of 128 texts pads less than any batch the server can form, and would set a limit it cannot
    reach."""
    from distrinews.bench import serving_limit
    from distrinews.predict import runtimes

    passes: list[int] = []

    class Counting:
        runtime = "fake"

        def warmup(self):
            pass

        def encode(self, texts):
            return [t.split() for t in texts]

        def predict_encoded(self, batch):
            passes.append(len(batch))
            return [{} for _ in batch]

    monkeypatch.setattr(runtimes, "make_predictor", lambda *a, **k: Counting())
    texts = [" ".join(["w"] * (1 + i % 7)) for i in range(100)]
    alone = serving_limit.runtime_alone("unused", "fake", texts, 0.05, None, 32, None, in_flight=5)
    assert alone["in_flight"] == 5 and max(passes) == 5  # batch 8, 16 and 32 alike: 5 texts at most
    passes.clear()
    serving_limit.runtime_alone("unused", "fake", texts, 0.05, None, 32, None)
    assert max(passes) == 32  # the batcher's whole lookahead: full batches of 32


def test_where_the_server_runs_passes_side_by_side_so_does_the_runtime_alone_and_the_limit_is_the_best(monkeypatch):
    """The server's lanes run single-threaded passes at once: its limit must count what the runtime does that way
    too, or the share would be measured against a runtime slower than the server's own use of it."""
    import threading

    from distrinews.bench import serving_limit
    from distrinews.predict import runtimes

    seen: dict[str, set[int]] = {"wide": set(), "twin": set()}

    class Twinned:
        runtime = "fake"

        def __init__(self, kind: str):
            self.kind = kind

        def warmup(self):
            pass

        def single_threaded(self):
            return Twinned("twin")

        def encode(self, texts):
            return [t.split() for t in texts]

        def predict_encoded(self, batch):
            seen[self.kind].add(threading.get_ident())
            return [{} for _ in batch]

    monkeypatch.setattr(runtimes, "make_predictor", lambda *a, **k: Twinned("wide"))
    texts = [" ".join(["w"] * (1 + i % 7)) for i in range(100)]
    alone = serving_limit.runtime_alone("unused", "fake", texts, 0.05, None, 32, None, in_flight=32, lanes=2)
    assert alone["lanes"] == 2 and set(alone["side_by_side_texts_per_s"]) == {"8", "16", "32"}
    assert len(seen["twin"]) >= 2 and len(seen["wide"]) == 1  # the twin on a thread a lane, the one pass on ours
    every = [*alone["texts_per_s"].values(), *alone["side_by_side_texts_per_s"].values()]
    assert alone["best_texts_per_s"] == max(every)
    which = "side_by_side_texts_per_s" if alone["best_side_by_side"] else "texts_per_s"
    assert alone[which][str(alone["best_batch"])] == alone["best_texts_per_s"]
    single = serving_limit.runtime_alone("unused", "fake", texts, 0.05, None, 32, None, in_flight=32)
    assert single["lanes"] == 1 and single["side_by_side_texts_per_s"] == {}
    lines = serving_limit.markdown(
        {"runtime_alone": alone, "empty_responder": {"p50_ms": None}, "concurrency": 32, "runtime": "fake"}
    )
    assert any("2 single-threaded passes side by side, batch 16" in line for line in lines)

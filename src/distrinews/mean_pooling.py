"""A BERT classifier that pools the mean of its tokens instead of the [CLS] token (``classifier_pooling: mean``).

``BertForSequenceClassification`` classifies the [CLS] token's state through BERT's pooler (a dense
layer and tanh pretrained for next-sentence prediction). Sentence encoders such as all-MiniLM-L6-v2,
DistriNews's default model, were trained to mean their token states instead, so their [CLS] state
was never trained to summarise the text. This classifier means the last layer's states over the
real tokens (the attention mask's ones), then dropout and one linear layer, as ModernBERT's
``classifier_pooling="mean"`` and sentence-transformers' pooling do; BERT's pooler is not built.

The checkpoint records it: ``model_type: distrinews_mean_bert`` and an ``auto_map`` in config.json,
and this file beside the weights (transformers' custom-code convention), so that

- DistriNews (train, eval, serve, predict, export) loads it as it loads any checkpoint, and
- plain transformers loads it with ``trust_remote_code=True``; without it transformers refuses
  with a message, instead of silently pooling the [CLS] token of weights trained for the mean.

This file imports nothing but torch and transformers: it is the code that travels with a checkpoint.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertModel, BertPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

MODEL_TYPE = "distrinews_mean_bert"
CODE_FILE = "mean_pooling.py"  # this file's name beside the weights
# config.json's pointers to the code, for transformers' trust_remote_code
AUTO_MAP = {
    "AutoConfig": "mean_pooling.MeanPoolBertConfig",
    "AutoModelForSequenceClassification": "mean_pooling.MeanPoolBertForSequenceClassification",
}


class MeanPoolBertConfig(BertConfig):
    """BERT's config; the model type alone says the classifier means the tokens."""

    model_type = MODEL_TYPE

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.auto_map = dict(AUTO_MAP)


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``hidden`` (batch, length, width) over the positions where ``attention_mask`` is 1."""
    if attention_mask is None:
        return hidden.mean(dim=1)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class MeanPoolBertForSequenceClassification(BertPreTrainedModel):
    config_class = MeanPoolBertConfig

    def __init__(self, config: MeanPoolBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        hidden = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
        ).last_hidden_state
        logits = self.classifier(self.dropout(masked_mean(hidden, attention_mask)))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save, then this file beside the weights. (Not transformers' own ``register_for_auto_class``:
        it copies the file of the object's class, which under FSDP2 is torch's generated wrapper class.)"""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            shutil.copyfile(Path(__file__), Path(save_directory) / CODE_FILE)


# In this process: the Auto classes know the type (a checkpoint loads without trust_remote_code).
AutoConfig.register(MODEL_TYPE, MeanPoolBertConfig, exist_ok=True)
AutoModelForSequenceClassification.register(MeanPoolBertConfig, MeanPoolBertForSequenceClassification, exist_ok=True)

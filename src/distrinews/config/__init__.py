"""The run's configuration: each field declared once, in the section of the component that reads it.

Field names follow Hugging Face ``TrainingArguments`` where the concept is the same, so a
Trainer user can read a preset without a glossary. The YAML presets, ``config.yaml`` and the
command line stay flat (``--learning_rate 3e-4``); each flat name belongs to one section
(``config.optimizer.learning_rate``), the way torchtitan's components own their config sections.

A field is declared with its type, default, help text and checks (pydantic ``Field``), and
everything else is derived from that one declaration: the flat names and their sections, the
parsing of command-line strings, validation with a message that names the field, the defaults
that records fill in, and the reference in the documentation (``reference``). The names
of the original system's scripts (``--epochs``, ``--batch_size``) are accepted as ``aliases``
of the field they mean. Every value is checked here, before any process group exists.
"""

from ..errors import ConfigError
from .sections import (
    DDP_COMM_HOOKS,
    DEFAULT_MODEL_VERSION,
    MULTI_LABEL,
    SECTIONS,
    SINGLE_LABEL,
    STRATEGIES,
    BatchConfig,
    DataConfig,
    DistillationConfig,
    OptimizerConfig,
    ParallelConfig,
    PrecisionConfig,
    is_version,
)
from .train_config import TrainConfig, canonical_name, field_default, fields, load_config, parse_overrides, reference

__all__ = [
    "DDP_COMM_HOOKS",
    "DEFAULT_MODEL_VERSION",
    "MULTI_LABEL",
    "SECTIONS",
    "SINGLE_LABEL",
    "STRATEGIES",
    "BatchConfig",
    "ConfigError",
    "DataConfig",
    "DistillationConfig",
    "OptimizerConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "TrainConfig",
    "canonical_name",
    "field_default",
    "fields",
    "is_version",
    "load_config",
    "parse_overrides",
    "reference",
]

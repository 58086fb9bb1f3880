"""The options that several commands take, each declared once: the same flag means the same thing, with one
default and one help, wherever it appears.

Where one flag name stands for two facts in two commands, both declarations are here, side by side, with the
reason; ``tests/unit/test_options.py`` fails on any other pair of commands that declare one flag differently.
"""

from __future__ import annotations

from ..data.fields import DEFAULT_TEXT_FIELD
from ..predict.runtimes import DEFAULT_RUNTIME, RUNTIMES
from . import NO_LIMIT, Option, limit

CHECKPOINT = Option("checkpoint", required=True, help="best/ directory, step-N directory or a legacy .pt file")
# serve alone may take it from the environment, as container platforms set it.
SERVE_CHECKPOINT = Option(
    "checkpoint",
    help="best/ directory, step-N directory or a legacy .pt file (default: $MODEL_CHECKPOINT)",
    env="MODEL_CHECKPOINT",
)
RUNTIME = Option(
    "runtime",
    DEFAULT_RUNTIME,
    f"inference runtime (default: {DEFAULT_RUNTIME}; auto = onnx-int8 where the checkpoint's "
    "int8 model passed its accuracy check against fp32 (made and checked at the first start "
    "if missing, into the cache, never the checkpoint), else torch; onnx-int8/onnx use "
    "CHECKPOINT/model.int8.onnx / model.onnx where it ships them, else the cache's, made at start "
    "if missing; torch-bf16 only where the CPU or GPU computes bf16 in hardware)",
    choices=RUNTIMES,
)
THREADS = Option(
    "threads",
    0,
    "CPU threads of each process's forward passes (0: the cores this process may use, under a CPU quota as many "
    "as the quota allows, shared among the --nproc workers where there are several)",
    minimum=0,
)
BATCH_SIZE = Option("batch_size", 64, "texts per forward pass", minimum=1)
# Two facts under one flag name. serve's bound is a latency bound: a batch forms from whatever concurrent requests
# are queued, and on a CPU small batches of similar lengths beat one batch padded to its longest text (32 clients
# on 2 cores, benchmarks/README.md: 1.7x the throughput of no limit for int8, 1.4x for PyTorch); on a GPU raise it
# (e.g. 16384). predict's passes are planned over a window of a corpus, sorted by length first
# (predict/batch/worker.py), so a pass is already of similar lengths and a larger bound costs no padding, only memory.
SERVE_MAX_BATCH_TOKENS = Option(
    "max_batch_tokens",
    512,
    f"padded tokens per forward pass (the batch's longest text x its texts); {NO_LIMIT}",
    type=limit,
)
MAX_BATCH_TOKENS = Option(
    "max_batch_tokens",
    4096,
    f"padded tokens per forward pass (the pass's longest text x its texts, texts of a window sorted by length); "
    f"{NO_LIMIT}",
    type=limit,
)
MIN_CONFIDENCE = Option(
    "min_confidence",
    None,
    'answers whose top probability is below this are marked "confident": false (the label is still given; a '
    "'confident' field or column, counted in serve's /metrics): a number for every label, LABEL=NUMBER pairs "
    "(World=0.8,Sports=0.6), or both (0.5,World=0.8)",
)
OTLP_ENDPOINT = Option(
    "otlp_endpoint",
    None,
    "send OpenTelemetry traces over OTLP/HTTP to this base URL (e.g. http://127.0.0.1:4318; default: "
    "$OTEL_EXPORTER_OTLP_ENDPOINT; neither: no tracing); needs the 'tracing' extra",
)
DATA = Option("data", help="AG News directory (default: $DISTRINEWS_DATA, else the HF hub)")
CONFIG = Option(
    "config", help="YAML preset, e.g. configs/cpu-quick.yaml (--field value after the options overrides it)"
)
INPUT = Option(
    "input",
    nargs="+",
    metavar="PATH",
    help="JSONL, CSV (with a header) or Parquet files, folders or globs (.jsonl.gz, .csv.gz too)",
)
TEXT_FIELD = Option(
    "text_field",
    DEFAULT_TEXT_FIELD,
    "the field holding the text (default: text; AG News rows with title and description are joined as in training)",
)

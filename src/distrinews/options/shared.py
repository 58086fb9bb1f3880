"""The options that several commands take, each declared once: the same flag means the same thing, with one
default and one help, wherever it appears.

Where one flag name stands for two facts in two commands, both declarations are here, side by side, with the
reason; ``tests/unit/test_options.py`` fails on any other pair of commands that declare one flag differently.
"""

from __future__ import annotations

from ..data.fields import DEFAULT_TEXT_FIELD
from . import NO_LIMIT, Option, limit

# The inference runtimes every command that runs a model offers (predict.runtimes makes each one)
RUNTIMES = ("auto", "torch", "torch-bf16", "onnx", "onnx-int8")
DEFAULT_RUNTIME = "auto"

_CHECKPOINT_HELP = "best/ directory, step-N directory or a legacy .pt file"
CHECKPOINT = Option("checkpoint", required=True, help=_CHECKPOINT_HELP)
# serve alone may take it from the environment, as container platforms set it.
SERVE_CHECKPOINT = Option("checkpoint", help=f"{_CHECKPOINT_HELP} (default: $MODEL_CHECKPOINT)", env="MODEL_CHECKPOINT")
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
# Every bench tool writes NAME.json, NAME.md (and its plots) here; NAME (--name) is the tool's own.
BENCH_OUTPUT_DIR = Option("output_dir", "runs/bench", "where the results go (NAME.json, NAME.md, plots)")

# One flag name, another fact: each entry is a command whose flag is declared apart from the other commands' and
# why. tests/unit/test_options.py fails on any other pair of commands that declare a flag differently, and on an
# entry here that no longer differs; the command-line reference lists them (docs/reference_pages.py).
DIFFERENT = {
    ("serve", "--checkpoint"): "also read from $MODEL_CHECKPOINT, as container platforms set it",
    ("serve-replicas", "--checkpoint"): "every replica's; also read from $MODEL_CHECKPOINT, may be a link",
    ("bench serving", "--checkpoint"): "the checkpoint the servers compared are started on",
    ("serve", "--max-batch-tokens"): "a latency bound on the server's batches (512), predict's a pass of a sorted "
    "window (4096): see SERVE_MAX_BATCH_TOKENS",
    ("bench serving", "--max-batch-tokens"): "passed on to serve; unset: serve's default",
    ("bench serving", "--max-batch-size"): "passed on to serve; unset: serve's default",
    ("bench serving", "--max-wait-ms"): "passed on to serve; unset: serve's default",
    ("bench serving", "--threads"): "passed on to serve; unset: serve's default",
    ("serve-replicas", "--threads"): "each replica's, the cores shared among the replicas",
    ("bench serving", "--data"): "where the request texts come from",
    ("bench collectives", "--batch-size"): "a training batch per process, for the compute time",
    ("bench collectives", "--bf16"): "training compute in bf16, on unless --no-bf16",
    ("serve-replicas", "--header-timeout"): "nginx's, in front of the replicas",
    ("serve-replicas", "--host"): "nginx's interface; the replicas listen on 127.0.0.1",
    ("doctor", "--host"): "the rendezvous address",
    ("serve-replicas", "--port"): "nginx's port (default 8080; 0: a free one)",
    ("doctor", "--port"): "the rendezvous port",
    ("doctor", "--json"): "a file the findings are written to, not a switch",
    ("export", "--runtime"): "what a Space runs: no auto, no torch-bf16; unset only with --format space",
    ("bench batch", "--runtime"): "every engine's; unset: predict's and serve's default",
    ("export", "--output"): "the exported file or Space folder",
    ("report", "--output"): "the plot",
    ("bench scaling", "--nproc"): "a list of worker counts, one point each",
    ("bench batch", "--nproc"): "a list of predict --nproc, one run each",
    ("export", "--version"): "the model version stamped on the export; `distrinews --version` is the program's",
    ("bench collectives", "--nproc"): "the processes of the collectives",
    ("doctor", "--nproc"): "the ranks to start",
    ("train", "--output-dir"): "the run's folder (the config's output_dir)",
    ("tune", "--output-dir"): "the study's folder",
    ("audit", "--output-dir"): "the audit's folder",
    ("bench serving", "--output-dir"): "bench serving declares its own (bench/serving*.py)",
    ("bench scaling", "--name"): "each bench tool's file name stem",
    ("bench collectives", "--name"): "each bench tool's file name stem",
    ("bench serving", "--name"): "each bench tool's file name stem",
    ("bench profile", "--name"): "each bench tool's file name stem",
    ("bench profile", "--steps"): "training steps timed without the profiler",
    ("bench scaling", "--timeout"): "seconds per point",
    ("bench collectives", "--timeout"): "seconds for the whole run",
    ("doctor", "--timeout"): "the rendezvous and collectives' timeout",
    ("bench serving", "--warmup"): "seconds before each level, not steps",
    ("bench profile", "--warmup"): "training steps before the timed ones",
}

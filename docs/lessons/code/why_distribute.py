"""The arithmetic of why and when to distribute: memory per parameter, what fits, and a step's compute
against its communication, for this project's two models, on the world size this runs on.

    torchrun --nproc_per_node 2 docs/lessons/code/why_distribute.py
    torchrun --nproc_per_node 2 docs/lessons/code/why_distribute.py --rows 4    # Try it
"""

import sys

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
N = dist.get_world_size()
ROWS = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 32  # per rank per step
TOKENS = 128  # per row
FLOPS, BANDWIDTH = 100e12, 100e9  # the guide's assumed device: 100 TFLOP/s, 100 GB/s per link
say = print if dist.get_rank() == 0 else (lambda *a: None)


def classifier(vocab, hidden, layers, heads, ffn, token_types, classes=4):
    """A BERT-shaped text classifier (BERT and DistilBERT have these shapes), on the meta device: its
    parameters are counted, never allocated."""
    with torch.device("meta"):
        tables = [nn.Embedding(vocab, hidden), nn.Embedding(512, hidden)] + [nn.Embedding(2, hidden)] * token_types
        body = [nn.LayerNorm(hidden)] + [nn.TransformerEncoderLayer(hidden, heads, ffn) for _ in range(layers)]
        head = [nn.Linear(hidden, hidden), nn.Linear(hidden, classes)]  # BERT's pooler, DistilBERT's pre_classifier
        return nn.ModuleList(tables), nn.ModuleList(body + head)


def count(module):
    return sum(p.numel() for p in module.parameters())


def arithmetic(name, embed, rest):
    params, lookups = count(embed) + count(rest), count(embed)
    say(f"{name}: {params:,} parameters, {lookups:,} of them embeddings ({lookups / params:.0%})")
    say(f"  to train in fp32 with Adam, 16 B per parameter: weights {4 * params / 1e6:.0f} MB + gradients "
        f"{4 * params / 1e6:.0f} MB + Adam's m and v {8 * params / 1e6:.0f} MB = {16 * params / 1e6:.0f} MB")
    flop = 6 * (params - lookups) * ROWS * TOKENS  # forward 2, backward 4 per weight per token (a lookup: ~0)
    compute = flop / FLOPS
    sent = 2 * (N - 1) / N * 4 * params  # a ring all-reduce of the fp32 gradients, per rank
    talk = sent / BANDWIDTH
    say(f"  one step, {ROWS} rows x {TOKENS} tokens per rank: compute {flop:.3g} FLOP = {compute * 1e3:.2f} ms, "
        f"all-reduce {sent / 1e6:.1f} MB = {talk * 1e3:.2f} ms")
    say(f"  communication/computation: {talk / compute:.2f}")
    alone = N * compute  # one device doing all N ranks' rows
    say(f"  speedup on {N} devices: {alone / (compute + talk):.2f}x if the all-reduce waits for backward, "
        f"{alone / max(compute, talk):.2f}x if backward hides it")


arithmetic("MiniLM-L6 (this project's default)", *classifier(30522, 384, 6, 12, 1536, token_types=True))
arithmetic("DistilBERT (the guide's model)", *classifier(30522, 768, 6, 12, 3072, token_types=False))

need = 16 * 7e9  # the guide's 7B model, on 80 GB devices
say(f"7B parameters: {need / 1e9:.0f} GB to train, {need / 80e9:.1f}x an 80 GB device: it must be sharded "
    f"(FSDP / ZeRO-3 on 8 devices: {need / 8 / 1e9:.0f} GB each)")
hours = 1_000_000 / 32 * 1.0 * 10 / 3600  # the guide: 1M rows, 32 per batch, 1 s per batch, 10 epochs
say(f"the guide's run: {hours:.1f} h on 1 device, {hours / 2:.1f} h on 2, {hours / 8:.1f} h on 8 (communication free)")
dist.destroy_process_group()

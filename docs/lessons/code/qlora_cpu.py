"""QLoRA's idea on CPU: a frozen base stored in 8 bits (QLoRA: 4-bit NF4, CUDA only), small trainable LoRA
adapters beside it, under DDP: only the adapters' gradients are all-reduced.

    torchrun --nproc_per_node 2 docs/lessons/code/qlora_cpu.py
    torchrun --nproc_per_node 2 docs/lessons/code/qlora_cpu.py --full    # Try it
"""

import copy
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
FULL = "--full" in sys.argv  # the Try it: fine-tune the whole base in fp32 instead
WIDTH, RANK = 512, 8


class QLinear(nn.Module):
    """A linear layer whose frozen weight is int8 with one fp32 scale per output row, plus W + B @ A (LoRA)."""

    def __init__(self, linear):
        super().__init__()
        weight = linear.weight.detach()
        scale = weight.abs().amax(1, keepdim=True) / 127
        self.register_buffer("q", torch.round(weight / scale).to(torch.int8))  # 1 byte per weight
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.A = nn.Parameter(torch.randn(RANK, WIDTH) / WIDTH**0.5)
        self.B = nn.Parameter(torch.zeros(WIDTH, RANK))  # zero: training starts from the base model exactly

    def forward(self, x):  # dequantize on the fly (QLoRA computes in bf16; fp32 here)
        return nn.functional.linear(x, self.q * self.scale, self.bias) + x @ self.A.T @ self.B.T


torch.manual_seed(0)
base = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
teacher = copy.deepcopy(base)  # the task: the base model changed by a low-rank update in every layer
with torch.no_grad():
    for layer in teacher:
        layer.weight += torch.randn(WIDTH, 4) @ torch.randn(4, WIDTH) / WIDTH
model = base if FULL else nn.Sequential(*[QLinear(layer) for layer in base])
model = DDP(model)
sent = []  # bytes of every gradient bucket DDP all-reduces, counted by a communication hook


def counting_hook(state, bucket):
    sent.append(bucket.buffer().numel() * bucket.buffer().element_size())
    return allreduce_hook(None, bucket)  # the default: average the bucket over the ranks


model.register_comm_hook(None, counting_hook)
trainable = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.Adam(trainable, lr=2e-3)
stored = sum(t.numel() * t.element_size() for t in [*model.module.parameters(), *model.module.buffers()])
x = torch.randn(64, WIDTH) + rank  # each rank its own rows
with torch.no_grad():
    target = teacher(x)
losses = []
for _ in range(20):
    sent.clear()  # count the last step's buckets
    loss = nn.functional.mse_loss(model(x), target)
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
if rank == 0:
    weights = sum(p.numel() for p in base.parameters())
    print(f"{'full fine-tuning, fp32 base' if FULL else 'int8 base + LoRA rank 8'}: model stored in {stored:,} B")
    print(f"trainable: {sum(p.numel() for p in trainable):,} parameters (the base has {weights:,}); Adam's state "
          f"{8 * sum(p.numel() for p in trainable):,} B")
    print(f"all-reduced per step: {sum(sent):,} B in {len(sent)} bucket(s)")
    print(f"loss: {losses[0]:.4f} at step 1, {losses[-1]:.4f} at step 20")
dist.destroy_process_group()

"""The reference card's formulas, worked out: ring traffic, bus bandwidth, memory per parameter for DDP and each
ZeRO / FSDP stage, speedup and efficiency (from the guide's own benchmark).

    torchrun --nproc_per_node 2 docs/lessons/code/formulas.py
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
say = print if dist.get_rank() == 0 else (lambda *a: None)

say("ring all-reduce: each rank sends (and receives) 2(N-1)/N times the tensor")
say("  " + ", ".join(f"N={n}: {2 * (n - 1) / n:.3f}" for n in (2, 4, 8, 16, 64)))
rank, N = dist.get_rank(), dist.get_world_size()
x = torch.arange(1024, dtype=torch.float32) * (rank + 1)  # 4,096 B, different on every rank
chunks, sent = list(x.clone().chunk(N)), 0
for phase in ("reduce-scatter", "all-gather"):  # a ring all-reduce by hand: N-1 steps per phase
    for step in range(N - 1):
        out = (rank - step + (phase == "all-gather")) % N  # the chunk this rank passes to its right neighbour
        into = (out - 1) % N  # the chunk arriving from its left neighbour
        incoming = torch.empty_like(chunks[into])
        for work in (dist.isend(chunks[out], (rank + 1) % N), dist.irecv(incoming, (rank - 1) % N)):
            work.wait()
        sent += chunks[out].numel() * 4
        chunks[into] = chunks[into] + incoming if phase == "reduce-scatter" else incoming
expected = x.clone()
dist.all_reduce(expected)
say(f"  a ring by hand on N={N}: rank 0 sent {sent:,} B for a {x.numel() * 4:,} B tensor "
    f"({sent / (x.numel() * 4):.3f}x); equals dist.all_reduce: {torch.equal(torch.cat(chunks), expected)}")

say("bus bandwidth = algorithm bandwidth (S / time) x a factor per collective (nccl-tests' convention):")
for name, factor in (("all_reduce", "2(N-1)/N"), ("all_gather, reduce_scatter", "(N-1)/N"), ("broadcast", "1")):
    say(f"  {name:<27} x {factor}")

say("bytes per parameter, Adam in mixed precision (2 B weights, 2 B gradients, 12 B fp32 copy + m + v), N=8:")
N8 = 8
stages = {
    "DDP (every rank holds everything)": 2 + 2 + 12,
    "ZeRO-1 (optimizer state sharded)": 2 + 2 + 12 / N8,
    "ZeRO-2 / FSDP SHARD_GRAD_OP (+ gradients)": 2 + (2 + 12) / N8,
    "ZeRO-3 / FSDP FULL_SHARD (+ weights)": (2 + 2 + 12) / N8,
}
for name, per_param in stages.items():
    say(f"  {name:<42} {per_param:5.2f} B: MiniLM {per_param * 22_714_756 / 1e6:6.0f} MB, "
        f"7B {per_param * 7e9 / 1e9:5.1f} GB per rank")

# The guide's benchmark (its section 11): 1 GPU 24 min, 8 min per epoch, 250 rows/s; 2 GPUs 14 min, 4.5, 444.
guide = (("total time 24 / 14 min", 24 / 14), ("epoch 8 / 4.5 min", 8 / 4.5), ("444 / 250 rows/s", 444 / 250))
for what, speedup in guide:
    say(f"the guide's {what}: speedup {speedup:.2f}x, efficiency {speedup / 2:.0%} (speedup / N, N=2)")
dist.destroy_process_group()

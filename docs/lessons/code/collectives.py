"""Every collective of torch.distributed on 2 ranks: each rank's tensor before and after.

    torchrun --nproc_per_node 2 docs/lessons/code/collectives.py
    torchrun --nproc_per_node 2 docs/lessons/code/collectives.py --blocking-swap    # Try it
"""

import datetime
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
R = dist.ReduceOp


def mine(dtype=torch.float32):  # rank 0 holds [1, 2], rank 1 holds [3, 4]
    return torch.tensor([1, 2], dtype=dtype) + 2 * rank


def fmt(x):  # [1, 2], [[1, 2], [3, 4]], or - for no result
    if isinstance(x, torch.Tensor):
        return "[" + ", ".join(f"{v:g}" for v in x.tolist()) + "]"
    return "[" + ", ".join(map(fmt, x)) + "]" if isinstance(x, list) else x or "-"


def show(name, before, after):
    rows = [None] * world  # every rank's (before, after), gathered so that rank 0 prints them in order
    dist.all_gather_object(rows, (fmt(before), fmt(after)))
    if rank == 0:
        print(f"{name:<26}" + "   ".join(f"rank {r}: {b} -> {a}" for r, (b, a) in enumerate(rows)))


def in_place(name, collective, dtype=torch.float32, **options):  # the collectives that overwrite their input
    t = mine(dtype)
    collective(t, **options)
    show(name, mine(dtype), t)


in_place("broadcast(src=0)", dist.broadcast, src=0)
dist.reduce(t := mine(), dst=0, op=R.SUM)  # every rank calls it; only rank 0's result is defined
show("reduce(dst=0, SUM)", mine(), t if rank == 0 else None)
for op in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):  # the bitwise ones on integers
    dtype = torch.int64 if op in (R.BAND, R.BOR, R.BXOR) else torch.float32
    in_place(f"all_reduce({str(op).split('.')[-1]})", dist.all_reduce, dtype, op=op)
out = [torch.zeros(2) for _ in range(world)]
dist.all_gather(out, mine())
show("all_gather", mine(), out)
chunks, out = [mine() * 10**r for r in range(world)], torch.zeros(2)  # chunk r of every rank, summed, to rank r
dist.reduce_scatter(out, chunks)
show("reduce_scatter(SUM)", chunks, out)
out = torch.zeros(2)
dist.scatter(out, [torch.tensor([10.0, 11]), torch.tensor([20.0, 21])] if rank == 0 else None, src=0)
show("scatter(src=0)", "[[10, 11], [20, 21]]" if rank == 0 else None, out)
got = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
dist.gather(mine(), got, dst=0)
show("gather(dst=0)", mine(), got)
t = mine()
dist.send(t, dst=1) if rank == 0 else dist.recv(t, src=0)  # blocking: each returns when the pair is done
show("send(dst=1) / recv(src=0)", mine(), t)
peer, out, stage = 1 - rank, torch.zeros(2), "send"
pair = dist.new_group(timeout=datetime.timedelta(seconds=3))  # a swap that deadlocks fails in 3 s, not 30 min
try:
    if "--blocking-swap" in sys.argv:  # both ranks send first: each send waits for a recv that never starts
        dist.send(mine(), dst=peer, group=pair)
        stage = "recv"
        dist.recv(out, src=peer, group=pair)
    for work in [dist.isend(mine(), dst=peer, group=pair), dist.irecv(out, src=peer, group=pair)]:
        work.wait()  # both transfers were started before either is waited for
    show("isend / irecv (swap)", mine(), out)
except RuntimeError:  # a timeout, or the peer's giving up first: which one comes first varies
    show("send / recv (swap)", mine(), f"RuntimeError in {stage}")
alone = [dist.new_group([r]) for r in range(world)]  # every rank creates every group, in the same order
in_place("all_reduce(group=[rank])", dist.all_reduce, group=alone[rank])
work = dist.all_reduce(t := mine(), async_op=True)  # returns at once, with a handle
busy = torch.randn(256, 256) @ torch.randn(256, 256)  # compute while the all-reduce runs
work.wait()  # only now is t the sum
show("all_reduce(async_op=True)", mine(), t)
dist.destroy_process_group()

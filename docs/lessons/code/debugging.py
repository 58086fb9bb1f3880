"""Two tools for a distributed job that hangs or goes wrong, each shown catching its fault.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --nproc_per_node 2 docs/lessons/code/debugging.py
    torchrun --nproc_per_node 2 docs/lessons/code/debugging.py    # Try it: without DETAIL
"""

import datetime
import time

import torch
import torch.distributed as dist
from torch.distributed import constants

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    print(f"debug level: {dist.get_debug_level()}")
    print(f"default timeouts: gloo {constants.default_pg_timeout}, nccl {constants.default_pg_nccl_timeout}")
# Each fault happens in a group of its own, with a 3 s timeout (the default is 30 minutes); the default group
# stays healthy and carries the reports to rank 0.
faulty = dist.new_group(timeout=datetime.timedelta(seconds=3))


def report(text):
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, text)
    if rank == 0:
        for r, row in enumerate(rows):
            print(f"rank {r}, {row}".replace(", but Rank", ",\n    but Rank").replace(").Coll", ").\n    Coll"))


# 1. A mismatched collective: a bug gives rank 1 one more element (a ragged last batch, a branch on the
# rank). DETAIL checks every collective's op, shapes and dtypes across the ranks before running it.
t = torch.ones(2 + rank)
try:
    dist.all_reduce(t, group=faulty)
    outcome = f"returned {t.tolist()}"
except RuntimeError as e:
    outcome = f"RuntimeError: {str(e).split('] ')[-1].split(' for ')[0]}"  # gloo's send or recv: either
report(f"all_reduce of {t.numel()} elements: {outcome}")

# 2. monitored_barrier (gloo only): rank 0 waits for each rank in turn and names the first one that is late,
# where a plain barrier would only time out. Rank 1 is stuck for 2 s (in I/O, say).
late = dist.new_group()
if rank == 1:
    time.sleep(2)
try:
    dist.monitored_barrier(late, timeout=datetime.timedelta(seconds=1))
    outcome = "passed"
except RuntimeError as e:
    outcome = f"RuntimeError: {e}".splitlines()[0]
if rank == 0:
    print(f"rank 0, monitored_barrier(timeout=1s): {outcome}")
dist.destroy_process_group()

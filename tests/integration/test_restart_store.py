"""A restarted worker group must not read the addresses its dead predecessors left in the store.

torchrun's agent keeps one rendezvous TCPStore for the whole job and its restarted workers
connect to it again with the same key names (torch's comment: "We create a new TCPStore for
every retry so no need to add prefix for each attempt" no longer holds). A new rank 0 that
reaches gloo's connect before the new rank 1 has published its address reads the old rank 1's
and fails with "Connection refused": a `--max-restarts` run died this way on a loaded machine.
Here the agent's store is played by the test, and the new rank 1 starts late on purpose.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import torch.distributed as dist

from conftest import wait_until

WORKER = """
import torch, torch.distributed as dist
from distrinews.distributed.process_group import distributed_context
with distributed_context(timeout_s=60) as env:
    t = torch.ones(1) * (env.rank + 1)
    dist.all_reduce(t)
    assert t.item() == 3.0, t
    print("ok", env.rank, flush=True)
"""


def _start(rank: int, port: int, attempt: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
        "TORCHELASTIC_RUN_ID": "restart-test",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_restarted_group_connects_to_its_own_peers_not_the_dead_ones():
    agent_store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    port = agent_store.port
    first = [_start(r, port, 0) for r in (0, 1)]
    for p in first:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    # attempt 1: rank 0 at once, rank 1 only once rank 0 has joined and waits in the store (as after model loading
    # on a busy machine): the dead attempt's keys are there for rank 0 to take, if it looked at them
    keys = agent_store.num_keys()
    rank0 = _start(0, port, 1)
    rank1 = None
    try:
        joined = lambda: agent_store.num_keys() > keys or rank0.poll() is not None  # noqa: E731
        wait_until(joined, 120, "rank 0 of attempt 1 joining")
        assert rank0.poll() is None, f"rank 0 did not wait for its own peer: {rank0.communicate()}"
        rank1 = _start(1, port, 1)
        results = [p.communicate(timeout=90) for p in (rank0, rank1)]
    finally:
        for p in (rank0, rank1):
            if p is not None:
                p.kill()
    for p, (out, err) in zip((rank0, rank1), results):
        assert p.returncode == 0, err[-2000:]
        assert out.startswith("ok")

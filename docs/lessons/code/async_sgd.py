"""Synchronous against asynchronous SGD with a parameter server: rank 0 holds the parameters, workers on rank 1
push gradients, and asynchronous workers compute theirs on parameters that are already stale.

    torchrun --nproc_per_node 2 docs/lessons/code/async_sgd.py
    torchrun --nproc_per_node 2 docs/lessons/code/async_sgd.py --workers 1    # Try it
"""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
WORKERS = int(sys.argv[sys.argv.index("--workers") + 1]) if "--workers" in sys.argv else 4
D, GRADIENTS = 8, 96  # each run computes the same 96 gradients
torch.manual_seed(0)
X = torch.randn(256, D)
Y = X @ torch.randn(D) + 0.01 * torch.randn(256)  # a least-squares problem; rows split over the workers
shards = list(zip(X.chunk(WORKERS), Y.chunk(WORKERS)))


def gradient(w, j):  # worker j's gradient of the mean squared error, on its own rows
    x, y = shards[j]
    return 2 * x.T @ (x @ w - y) / len(x)


def server(sync, lr):
    """Rank 0: applies every gradient it receives; sync waits for all workers' and applies their average."""
    w, version, staleness, msg = torch.zeros(D), 0, [], torch.empty(D + 1)  # msg: a gradient and its version
    losses = []
    for _ in range(GRADIENTS // WORKERS):
        grads = []
        for _ in range(WORKERS):
            dist.recv(msg, src=1)
            staleness.append(version - int(msg[D]))  # updates made since the worker read its parameters
            grads.append(msg[:D].clone())
            if not sync:
                w, version = w - lr * grads[-1], version + 1
                dist.send(torch.cat([w, torch.tensor([version])]), dst=1)
        if sync:
            w, version = w - lr * torch.stack(grads).mean(0), version + 1
            for _ in range(WORKERS):
                dist.send(torch.cat([w, torch.tensor([version])]), dst=1)
        losses.append(((X @ w - Y) ** 2).mean().item())
    mean = sum(staleness) / len(staleness)
    print(f"{'sync ' if sync else 'async'} SGD, lr {lr}, workers: {WORKERS}, {version} updates from "
          f"{len(staleness)} gradients, staleness mean {mean:.2f} max {max(staleness)}")
    print("  loss after 24, 48, 96 gradients: " + ", ".join(f"{losses[n // WORKERS - 1]:.3g}" for n in (24, 48, 96)))


def workers(sync, lr):
    """Rank 1: the workers in turn, each with its own copy of the parameters and the version it read."""
    copies, msg = [torch.zeros(D + 1) for _ in range(WORKERS)], torch.empty(D + 1)
    for _ in range(GRADIENTS // WORKERS):
        for j in range(WORKERS):
            dist.send(torch.cat([gradient(copies[j][:D], j), copies[j][D:]]), dst=0)
            if not sync:  # this worker reads the new parameters; the others still hold older ones
                dist.recv(msg, src=0)
                copies[j] = msg.clone()
        if sync:  # every worker waits for the one update made from all their gradients
            for j in range(WORKERS):
                dist.recv(copies[j], src=0)


for sync, lr in ((True, 0.3), (False, 0.3), (False, 0.075)):
    (server if rank == 0 else workers)(sync, lr)
    dist.barrier()
dist.destroy_process_group()

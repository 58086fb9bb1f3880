"""The bandwidth hierarchy: one all-reduce of a model's gradients, timed here between two processes, then
worked out for the links a real job crosses (their bandwidths are vendors' figures, not measured here).

    torchrun --nproc_per_node 2 docs/lessons/code/bandwidth.py
    torchrun --nproc_per_node 2 docs/lessons/code/bandwidth.py --two-nodes    # Try it
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
GRADIENTS = 4 * 22_714_756  # MiniLM-L6's fp32 gradients, in bytes (see why_distribute.py)
# Per direction, per GPU. NVLink 4 on an H100 SXM: 900 GB/s both ways; PCIe 5.0 x16: about 64 GB/s; one 400 Gb/s
# InfiniBand NDR port per GPU (as in a DGX H100): 50 GB/s; one 100 Gb/s Ethernet port per node: 12.5 GB/s.
LINKS = {"NVLink 4": 450e9, "PCIe 5.0 x16": 64e9, "InfiniBand NDR, 400 Gb/s": 50e9, "Ethernet, 100 Gb/s": 12.5e9}
COMPUTE_S = 0.00265  # one step's forward and backward, 32 rows x 128 tokens (why_distribute.py, 100 TFLOP/s)

flat = torch.ones(GRADIENTS // 4 // 8)  # an eighth of the gradients: enough to time, quick on two busy cores
times = []
for _ in range(5):
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(flat)
    times.append(time.perf_counter() - start)
here = flat.numel() * 4 * 2 * (world - 1) / world / statistics.median(times)  # bus bandwidth: bytes per link per s
if rank == 0:
    print(f"measured here, gloo between {world} processes on one machine: {here / 1e9:.2f} GB/s per link")


def ring(n, bandwidth):
    """A ring all-reduce of the gradients on n GPUs: each link carries 2(n-1)/n of them, all links at once."""
    return 2 * (n - 1) / n * GRADIENTS / bandwidth


def report(label, n, link):
    talk = ring(n, LINKS[link])
    if rank == 0:
        print(f"  {label:<28} {n:2d} GPUs, slowest link {link:<24}: all-reduce {talk * 1e3:6.2f} ms, "
              f"{talk / COMPUTE_S:5.2f}x the step's compute")


if rank == 0:
    print(f"all-reduce of MiniLM's {GRADIENTS:,} B of gradients (ring), against {COMPUTE_S * 1e3:.2f} ms of compute:")
report("one node, NVLink", 8, "NVLink 4")
report("one node, PCIe only", 8, "PCIe 5.0 x16")
if "--two-nodes" in sys.argv:  # the Try it: the same job on two nodes: the ring now crosses the network
    report("two nodes, InfiniBand", 16, "InfiniBand NDR, 400 Gb/s")
    report("two nodes, shared Ethernet", 16, "Ethernet, 100 Gb/s")
dist.destroy_process_group()

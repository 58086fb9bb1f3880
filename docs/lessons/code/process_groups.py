"""What torchrun gives each process, and the four ways to form a process group, each one shown working.

    torchrun --nproc_per_node 2 docs/lessons/code/process_groups.py
    torchrun --nproc_per_node 2 docs/lessons/code/process_groups.py --world-size-3    # Try it
"""

import datetime
import os
import shutil
import socket
import sys
import tempfile

import torch
import torch.distributed as dist

SET_BY_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
claimed = world + 1 if "--world-size-3" in sys.argv else world  # the Try it: one rank too many announced


def report(text):
    rows = [None] * world  # gathered so that rank 0 prints every rank's line, in rank order
    dist.all_gather_object(rows, text)
    if rank == 0:
        print("\n".join(rows))


def check(method):  # a collective over the new group: every rank contributes rank + 1
    t = torch.tensor([rank + 1])
    dist.all_reduce(t)
    report(f"  {method:<9} rank {dist.get_rank()} of {dist.get_world_size()}, backend {dist.get_backend()}: "
           f"all_reduce(rank + 1) = {t.item()}")
    dist.destroy_process_group()


# 1. env:// (the default): MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the environment torchrun set
dist.init_process_group("gloo", init_method="env://")
report(f"rank {rank}: " + " ".join(f"{k}={os.environ[k]}" for k in SET_BY_TORCHRUN))
if rank == 0:
    available = (f"{b} {getattr(dist, f'is_{b}_available')()}" for b in ("gloo", "nccl", "mpi", "ucc"))
    print("backends built into this torch: " + ", ".join(available))
    print("init methods, each forming a new group of the same 2 processes:")
# The other methods need meeting points the ranks agree on: rank 0 picks a free port and a file name, and
# starts a store; it broadcasts them through this first group (on a cluster: the job's configuration).
meeting, store = [None, None, None], None
if rank == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    meeting = [port, tempfile.mkdtemp(), store.port]
dist.broadcast_object_list(meeting, src=0)
port, folder, store_port = meeting
check("env://")

# 2. tcp://: rank 0 serves a store at the address, the others connect; rank and world size are passed in.
# torchrun sets TORCHELASTIC_USE_AGENT_STORE=True, which makes every rank a client of torchrun's own store
# at a tcp:// address: set it off, as it is when you start the processes yourself.
agent_store, os.environ["TORCHELASTIC_USE_AGENT_STORE"] = os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), "False"
try:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=claimed,
                            timeout=datetime.timedelta(seconds=3))
    check("tcp://")
except dist.DistStoreError as e:  # only with --world-size-3: the group waits for a rank that never comes
    if rank == 0:
        print(f"  tcp://    world_size={claimed} on {world} processes: DistStoreError: {e}")
os.environ["TORCHELASTIC_USE_AGENT_STORE"] = agent_store or "False"  # as torchrun set it, for what runs next

# 3. file://: a file on a file system every rank sees (NFS on a cluster); it must not exist beforehand.
dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
check("file://")

# 4. a Store you build yourself: here the TCPStore rank 0 started above (the kind torchrun serves for env://).
store = store or dist.TCPStore("127.0.0.1", store_port, world, is_master=False)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
dist.barrier()  # rank 0 removes the folder only once every rank is done with the file
if rank == 0:
    shutil.rmtree(folder)
check("TCPStore")

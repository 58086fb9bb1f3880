"""Run several lesson files one after another under one torchrun launch (what the test does).

    torchrun --nproc_per_node 2 docs/lessons/run_many.py OUT_DIR '[{"name": ..., "file": ..., "args": [...]}]'

Starting torchrun and importing torch in three processes is most of a small lesson's time. Here each worker
imports torch once, then forks one child per lesson, which runs the lesson file as ``__main__`` with its own
``sys.argv``, as ``torchrun --nproc_per_node 2 FILE ARGS`` would (a process of its own, torchrun's variables).
What the child prints goes to ``OUT_DIR/NAME.txt`` on rank 0 (lessons print on rank 0 only: that is the whole
output) and must be nothing on the other ranks.

Each lesson meets at a store of its own: a process group opened again through one store finds the previous
group's keys there (gloo's addresses of the last round), and a rank can connect to a port nobody listens on any
more. Rank 0 serves a new store on a port the kernel picks and tells the others through torchrun's.
"""

from __future__ import annotations

import faulthandler
import json
import os
import runpy
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist


def main(out_dir: str, plan_json: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), timeout=timedelta(seconds=60))
    for i, item in enumerate(json.loads(plan_json)):
        server = None
        if rank == 0:
            server = dist.TCPStore(os.environ["MASTER_ADDR"], 0, is_master=True, wait_for_workers=False)
            agent.set(f"run_many/{i}/port", str(server.port))
        os.environ["MASTER_PORT"] = agent.get(f"run_many/{i}/port").decode()
        print(f"run_many: rank {rank} starts {item['name']}", file=sys.stderr, flush=True)  # where a hang is
        output = Path(out_dir, f"{item['name']}.txt" if rank == 0 else f"{item['name']}.rank{rank}.txt")
        child = os.fork()
        if child == 0:
            run(item, output)
        _, status = os.waitpid(child, 0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"{item['file']} {' '.join(item['args'])} failed on rank {rank} (see above)")
        if rank != 0 and output.read_text():
            raise SystemExit(f"{item['file']} printed on rank {rank}; lessons print on rank 0 only")
        agent.add(f"run_many/{i}/done", 1)
        while agent.add(f"run_many/{i}/done", 0) < world:  # rank 0's store outlives every rank's use of it
            time.sleep(0.01)
        del server


def run(item: dict, output: Path) -> None:
    """The child: the lesson file as __main__, its stdout into ``output``; never returns."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)  # a hung lesson's stacks, when stopped
    code = 0
    with output.open("w") as sys.stdout:
        sys.argv = [item["file"], *item["args"]]
        try:
            runpy.run_path(item["file"], run_name="__main__")
            if dist.is_initialized():
                raise RuntimeError("the lesson left its process group open: call dist.destroy_process_group()")
        except SystemExit as stop:
            code = 0 if stop.code in (None, 0) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
    os._exit(code)  # as a process ends: what the lesson left behind is not torn down object by object


if __name__ == "__main__":
    main(*sys.argv[1:])

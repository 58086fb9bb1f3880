"""Run several lesson files one after another in the processes of one torchrun launch (what the test does).

    torchrun --nproc_per_node 2 docs/lessons/run_many.py OUT_DIR '[{"name": ..., "file": ..., "args": [...]}]'

Starting torchrun and importing torch in three processes is most of a small lesson's time; here each lesson
file runs as ``__main__`` with its own ``sys.argv``, exactly as ``torchrun --nproc_per_node 2 FILE ARGS`` would
run it, and opens and closes its own process group (torchrun's store serves them all). What rank 0 prints goes
to ``OUT_DIR/NAME.txt``; lessons print on rank 0 only, so that is the whole output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(out_dir: str, plan_json: str) -> None:
    rank = int(os.environ["RANK"])
    threads = torch.get_num_threads()
    for item in json.loads(plan_json):
        sys.argv = [item["file"], *item["args"]]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            try:
                runpy.run_path(item["file"], run_name="__main__")
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    raise
        if dist.is_initialized():
            raise SystemExit(f"{item['file']} left its process group open: call dist.destroy_process_group()")
        torch.set_num_threads(threads)  # one lesson's setting is not the next one's
        if rank == 0:
            Path(out_dir, f"{item['name']}.txt").write_text(printed.getvalue())
        elif printed.getvalue():
            raise SystemExit(f"{item['file']} printed on rank {rank}; lessons print on rank 0 only")


if __name__ == "__main__":
    main(*sys.argv[1:])

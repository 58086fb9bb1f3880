"""The run directory's layout, and the rule that one directory holds one run.

    runs/<name>/
      config.yaml            resolved config of the run
      log.jsonl              one JSON object per logged step / eval (rank 0)
      tb/                    TensorBoard event files
      checkpoints/step-N/    resumable checkpoints
      best/                  the servable model with the best test accuracy so far

A directory that already holds a run is continued (``--resume auto``) or replaced
(``--overwrite_output_dir true``), never silently mixed with a new one: a new run's
checkpoints would be rotated away by the old run's higher step numbers, its log appended to
the old one, and a later ``--resume auto`` would pick the old run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .config import ConfigError, TrainConfig

# What a run writes; the only things ``--overwrite_output_dir`` removes (never a user's other files).
RUN_ARTIFACTS = ("config.yaml", "log.jsonl", "tb", "checkpoints", "best", "training_curves.png")


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def log(self) -> Path:
        return self.path / "log.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.path / "tb"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def best(self) -> Path:
        return self.path / "best"

    @property
    def curves(self) -> Path:
        return self.path / "training_curves.png"

    def previous_run(self) -> list[str]:
        """The artifacts of an earlier run found here (empty for a new or empty directory)."""
        found = []
        for name in RUN_ARTIFACTS:
            p = self.path / name
            if p.is_file() or (p.is_dir() and any(p.iterdir())):
                found.append(name)
        return found

    def check_usable(self, resume: str | None, overwrite: bool) -> None:
        """Fail, naming the field, when the directory cannot take this run; touches nothing."""
        for parent in (self.path, *self.path.parents):
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(f"config field 'output_dir': {self.path} is under {parent}, which is a file, not a directory")
                if not os.access(parent, os.W_OK | os.X_OK):
                    raise ConfigError(f"config field 'output_dir': cannot write to {parent} (permission denied)")
                break
        previous = self.previous_run()
        if previous and resume is None and not overwrite:
            raise ConfigError(
                f"config field 'output_dir': {self.path} already holds a run ({', '.join(previous)}); "
                "pass --resume auto to continue it, or --overwrite_output_dir true to replace it"
            )

    def prepare(self, config: TrainConfig, resumed: bool) -> None:
        """Rank 0, before anything is written: save the config, remove leftovers of killed saves.

        A run that does not continue a checkpoint starts from a clean directory: ``check_usable``
        let it in only when the directory was empty, replaced on purpose, or held a run that
        ``--resume auto`` found no checkpoint of.
        """
        if not resumed:
            self.clear()
        self.path.mkdir(parents=True, exist_ok=True)
        for directory in (self.path, self.checkpoints):
            clean_stale_tmp(directory)
        config.save_yaml(self.config)

    def clear(self) -> None:
        for name in RUN_ARTIFACTS:
            p = self.path / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()


def clean_stale_tmp(directory: Path) -> None:
    """Remove leftovers of saves that were killed midway (never a published checkpoint)."""
    if directory.is_dir():
        for p in directory.iterdir():
            if p.name.startswith((".tmp-", ".old-")):
                shutil.rmtree(p, ignore_errors=True)

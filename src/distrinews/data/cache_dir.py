"""Where DistriNews keeps what it can make again (tokenized splits, a teacher's probabilities, measured peak FLOPs,
a checkpoint's ONNX graphs): ``$DISTRINEWS_CACHE``, else ``$XDG_CACHE_HOME/distrinews``, else ``~/.cache/distrinews``.
Standard library only: the slim ONNX server reads it without torch.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DISTRINEWS_CACHE"


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distrinews"

"""DistriNews: fine-tune a transformer text classifier (AG News by default) with PyTorch DDP, and serve it.

The folders are the parts of the system (docs/architecture.md): ``data`` reads and batches AG News,
``train`` runs the loop, ``distributed`` launches and holds the process group, ``checkpoint``
writes and reads what a run leaves, ``serve`` answers HTTP, ``export`` writes ONNX and the Space
bundle, ``bench`` measures, and ``cli`` is the ``distrinews`` command over all of them.

From Python: ``distrinews.Classifier.load("runs/cpu-quick").predict("Oil prices jump")`` (a model in this
process), or ``distrinews.RemoteClassifier(url)`` (one that ``distrinews serve`` answers for).
"""

from typing import Any

from .version import __version__ as __version__

__all__ = ["Classifier", "RemoteClassifier"]


def __getattr__(name: str) -> Any:
    # Lazily: importing ``distrinews`` (the CLI, the docs build) must not import torch or httpx. Any, not the
    # classes: importing them here, even for the type checker only, would have the Space bundle copy them
    # (export/space/bundle.py follows every import it sees).
    if name == "Classifier":
        from .predict.classifier import Classifier

        return Classifier
    if name == "RemoteClassifier":
        from .predict.client import RemoteClassifier

        return RemoteClassifier
    raise AttributeError(f"module 'distrinews' has no attribute {name!r}")

"""DistriNews: fine-tune a transformer text classifier (AG News by default) with PyTorch DDP, and serve it.

The folders are the parts of the system (docs/architecture.md): ``data`` reads and batches AG News,
``train`` runs the loop, ``distributed`` launches and holds the process group, ``checkpoint``
writes and reads what a run leaves, ``serve`` answers HTTP, ``export`` writes ONNX and the Space
bundle, ``bench`` measures, and ``cli`` is the ``distrinews`` command over all of them.
"""

__version__ = "0.1.0"

"""DistriNews: fine-tune a transformer news classifier on AG News with PyTorch DDP, and serve it."""

__version__ = "0.1.0"

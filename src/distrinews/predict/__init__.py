"""Answering texts with a trained model, below both the HTTP server and the exports.

``runtimes`` (the predictors: torch, torch-bf16, onnx, onnx-int8, one interface and output), ``tokens``
(tokenization without transformers), ``batch_forming`` (which texts are computed together), ``onnx`` (making the
graphs). ``serve/`` puts the runtimes behind HTTP, ``export/`` writes their files for others, ``predict`` runs them
from the command line. Importing this package needs neither torch nor transformers.
"""

"""Serving a checkpoint over HTTP: the FastAPI app (``app``: routes and serving state; ``schemas``,
``limits``, ``metrics``, ``middleware``), the micro-batcher, the predictor protocol, runtimes
(torch, onnx, onnx-int8) and their tokenization, the serve options, and ``python -m
distrinews.serve``, the entry point that needs neither torch nor the training stack for an ONNX
runtime.
"""

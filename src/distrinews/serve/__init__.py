"""Serving a checkpoint over HTTP: the FastAPI app and what it holds, the micro-batcher, the serve options,
``serve-replicas`` behind nginx, and ``python -m distrinews.serve``, which needs no torch for an ONNX runtime.
"""

"""Answering texts with a trained model, below both the HTTP server and the exports.

``runtimes`` (the predictors: torch, torch-bf16, onnx, onnx-int8, one interface and output),
``tokens`` (tokenization without transformers where a ``tokenizer.json`` is at hand), ``batch_forming``
(which texts are computed together, for the server and batch inference), ``onnx`` (making the fp32 and int8
graphs). ``serve/`` puts the runtimes behind HTTP, ``export/`` writes their files for others, the ``predict``
command runs them from the command line. Importing this package needs neither torch nor transformers.
"""

"""Training: the loop (``trainer``), exact distributed evaluation, the precision and dropout policies,
FLOPs/MFU, metrics and their logs, the training curves, and the checks a run passes before any
worker starts (``preflight``). It builds on ``data``, ``distributed`` and ``checkpoint``.
"""

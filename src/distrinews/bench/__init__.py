"""Benchmarks and diagnostics: scaling, collectives, serving, and the model-FLOPs arithmetic (MFU)."""

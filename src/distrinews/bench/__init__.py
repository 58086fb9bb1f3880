"""Benchmarks and their reports: training scaling, collectives, serving (and its stages), fault
overhead, and comparisons with a plain PyTorch loop and the Hugging Face Trainer. Each tool runs as
``python -m distrinews.bench.NAME`` (under torchrun where it trains) or ``distrinews bench NAME``.
"""

"""Comparisons with systems the product never runs: the seed's training loop, Hugging Face Trainer, the seed-style
server, a TF-IDF baseline, and studies of the product's own internals (precision variants, serving stages, fault
handling's cost, replicas behind nginx). Run from the repository's root as ``python -m benchmarks.tools.NAME``
(``pip install -e '.[lab]'``). They import ``distrinews``; nothing in ``distrinews`` imports them.
"""

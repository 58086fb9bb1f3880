"""Corpus-scale batch inference: ``distrinews predict --input FILES --output FILE``, streaming, resumable.

``job`` (the options and the checks made before any model loads), ``shell`` (what both engines do around
their computing: the lock, ``--overwrite``, the summary), ``engine`` (the local engine: one
process or ``--nproc`` workers), ``ray_engine`` and ``ray_source`` (``--engine ray``: the same job on
Ray Data, not resumable), ``worker`` (read, tokenize, batch by tokens, compute and commit, in a
pipeline), ``state`` (the progress folder ``OUTPUT.partial/`` and its records), ``assemble`` (the
output and rejects files, in input order, published whole), ``outputs`` (JSONL, CSV, Parquet
writers), ``progress`` (the bar, the lines, the summary). The input files are read by
``data.files`` and ``data.fields``.
"""

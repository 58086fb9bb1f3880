"""Corpus-scale batch inference: ``distrinews predict --input FILES --output FILE``, streaming, resumable.

``job`` (the options and the checks made before any model loads), ``shell`` (the lock, ``--overwrite``, the summary:
around both engines), ``engine`` (local: one process or ``--nproc`` workers), ``ray_engine`` and ``ray_source``
(``--engine ray``, not resumable), ``worker`` (read, tokenize, batch, compute, commit), ``state`` (the progress folder
``OUTPUT.partial/``), ``assemble`` (the output in input order, published whole), ``outputs`` (the writers),
``progress`` (the bar, the lines, the summary). ``data.files`` and ``data.fields`` read the inputs.
"""

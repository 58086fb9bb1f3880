"""Our server against the servers a user would pick instead: LitServe, Ray Serve, BentoML and Infinity.

    python -m benchmarks.tools.peers install [--venv /work/peers-venv]    # the peers, in a virtualenv of their own
    python -m benchmarks.tools.peers run --checkpoint DIR --output-dir benchmarks/serving/MACHINE/peers \
        [--clients 1,4,8,32,64] [--duration 20] [--rounds 2] [--peers ours,litserve,rayserve,bentoml,infinity]

Every peer serves the same checkpoint with the same model and tokenizer as ``distrinews serve`` by default (its
int8 ONNX graph and the Rust tokenizer, loaded by the project's own code, ``serve_model.py``; Infinity through its
own engine on that graph), one server at a time on the same cores, under the same closed-loop load. The peer
scripts (``serve_NAME.py``) each give the configuration they run with; ``runner.py`` measures; ``report.py``
writes ``peers.json``, ``peers.md`` and ``peers.png``.
"""

"""``python -m benchmarks.tools.onnx_spinning GRAPH``: one ONNX pass on every core, batch 1, three ways of spinning.

ONNX Runtime's intra-op threads wait for work by spinning unless told not to. Three sessions of the same graph:

- ``off``: ``session.intra_op.allow_spinning`` 0, what ``distrinews serve`` did until 2026-11-29: a thread sleeps
  as soon as it has no work, so each operator of a pass wakes it again;
- ``on``: ONNX Runtime's default, what the peer servers run: threads spin between operators and between passes;
- ``stop``: ``session.force_spinning_stop`` 1, what ``serve`` does now: threads spin within a pass and stop when
  the last concurrent run returns.

Each round runs ``--passes`` passes on each session in turn, with ``--pause-ms`` between passes (a client's round
trip), and prints each session's median pass time and the cores this process kept busy (CPU time / wall time).
Hold the benchmark lock around it (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

MODES = ("off", "on", "stop")


def session(graph: str, mode: str, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    if mode == "off":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if mode == "stop":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])


def feed(sess: Any, tokens: int) -> dict[str, np.ndarray]:
    """A batch of one text of ``tokens`` ids (fixed seed), with its mask and token types where the graph takes them."""
    ids = np.random.default_rng(0).integers(1000, 5000, size=(1, tokens), dtype=np.int64)
    values = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    return {i.name: values[i.name] for i in sess.get_inputs()}


def one_round(sess: Any, inputs: dict[str, np.ndarray], passes: int, pause_s: float) -> tuple[float, float]:
    """(median ms per pass, cores busy) over ``passes`` passes after 20 unmeasured ones."""
    for _ in range(20):
        sess.run(None, inputs)
    times: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(passes):
        start = time.perf_counter()
        sess.run(None, inputs)
        times.append(time.perf_counter() - start)
        time.sleep(pause_s)
    return statistics.median(times) * 1e3, (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("graph", help="an ONNX graph, e.g. a checkpoint's model.int8.onnx")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2: both cores here)")
    parser.add_argument("--tokens", type=int, default=40, help="the text's length in tokens")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--passes", type=int, default=150, help="measured passes per session and round")
    parser.add_argument("--pause-ms", type=float, default=1.0, help="pause between passes")
    args = parser.parse_args()
    sessions = {mode: session(args.graph, mode, args.threads) for mode in MODES}
    inputs = feed(sessions["off"], args.tokens)
    results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, sess in sessions.items():
            results[mode].append(one_round(sess, inputs, args.passes, args.pause_ms / 1e3))
    print("| spinning | median ms per pass, by round | median | cores busy |")
    print("|---|---|---:|---:|")
    for mode, rounds in results.items():
        ms = [m for m, _ in rounds]
        busy = statistics.median(c for _, c in rounds)
        print(f"| {mode} | {' '.join(f'{m:.2f}' for m in ms)} | {statistics.median(ms):.2f} | {busy:.2f} |")


if __name__ == "__main__":
    main()

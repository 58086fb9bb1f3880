"""The limit ``distrinews bench serving`` measures our server against, in the same run and on the same texts.

- **The runtime alone**: the predictor the server loads (same runtime, same ``--threads``, same session
  options: ``make_predictor`` with ``spin=False``), called in this process with no HTTP and no queue.
  Batch 1: tokenize + run one text at a time (p50); throughput at the batch sizes the server forms:
  windows of texts tokenized at once and cut into passes by the server's own rule (``plan_passes``: at
  most the batch size in texts and ``max_batch_tokens`` padded tokens, texts of similar lengths together).
  A window holds the batcher's lookahead (4 x the batch size), but never more than the busiest level's
  clients keep in flight (``in_flight``: C clients, C texts), so the runtime groups lengths as well as the
  server can at that level and no better: with a window of 128 texts it would pad less than any batcher
  that only ever sees 32. Where the server runs passes side by side under load (its ``concurrent_passes``),
  so does the runtime: that many single-threaded passes at once, each on its own windows; the limit is the
  best of one pass at a time and passes side by side.
- **The empty responder**: a server on the same HTTP stack (uvicorn, h11, loopback) that reads each body
  and answers a fixed prediction-sized JSON body; loaded like ours, it is the load generator's and
  loopback's own floor (``python -m distrinews.bench.serving_limit --port P`` runs it).

From those and our server's rows: its overhead at one client (its p50 minus the runtime's batch-1 p50
minus the empty responder's p50), and its share at the busiest level of what the runtime alone computes
on the cores the load generator leaves (the runtime's best throughput x (cores - the generator's measured
CPU) / cores). The aims are printed and recorded as pass/fail.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from ..distributed.machine import usable_cores
from .serving_load import find_result, percentile_ms

OVERHEAD_AIM_MS = 0.5  # at one client: p50 within this of the runtime alone plus the empty responder
SHARE_AIM = 0.85  # at the busiest level: this share of the runtime's throughput on the cores left
SEED_AIM = 8.0  # at the busiest level: this many times the seed-style server's throughput
BATCH_SIZES = (1, 8, 16, 32)
# What the empty responder answers: the shape and size of one prediction (four AG News labels).
EMPTY_ANSWER = (
    b'{"label": "Sci/Tech", "label_id": 3, "confidence": 0.9619548320770264, "probabilities": {"World": '
    b'0.01325440388172865, "Sports": 0.004107183031737804, "Business": 0.020683573558926582, "Sci/Tech": '
    b"0.9619548320770264}}"
)


def runtime_alone(
    checkpoint: str,
    runtime: str,
    texts: list[str],
    duration: float,
    threads: int | None,
    max_batch_size: int,
    max_batch_tokens: int | None,
    in_flight: int | None = None,
    lanes: int = 1,
) -> dict[str, Any]:
    """The runtime alone, measured as the module's docstring says (``in_flight``: the texts a window may hold; None:
    the batcher's whole lookahead; ``lanes``: the server's ``concurrent_passes``)."""
    from ..predict.runtimes import make_predictor

    predictor = make_predictor(  # as distrinews serve makes it (serve/state.py's default_factory)
        checkpoint, runtime=runtime, max_batch_size=max_batch_size, threads=threads or None, spin=False
    )
    predictor.warmup()
    latencies = _one_at_a_time(predictor, texts, duration)
    sizes = sorted({b for b in (*BATCH_SIZES, max_batch_size) if b <= max_batch_size})
    windows = {size: min(4 * size, in_flight) if in_flight else 4 * size for size in sizes}  # the batcher's lookahead
    throughput = {
        str(size): _throughput([predictor], texts, windows[size], size, max_batch_tokens, duration) for size in sizes
    }
    side: dict[str, float] = {}
    twin = predictor.single_threaded() if lanes > 1 and hasattr(predictor, "single_threaded") else None
    if twin is not None:
        twin.warmup()
        side = {
            str(size): _throughput([twin] * lanes, texts, windows[size], size, max_batch_tokens, duration)
            for size in sizes
            if size > 1
        }
    runs = [(tps, int(size), False) for size, tps in throughput.items()]
    best_tps, best_batch, best_side = max(runs + [(tps, int(size), True) for size, tps in side.items()])
    return {
        "runtime": predictor.runtime,
        "threads": threads or None,
        "max_batch_tokens": max_batch_tokens,
        "in_flight": in_flight,
        "requests": len(latencies),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": percentile_ms(latencies, 0.99),
        "texts_per_s": throughput,
        "lanes": lanes if twin is not None else 1,
        "side_by_side_texts_per_s": side,
        "best_batch": best_batch,
        "best_side_by_side": best_side,
        "best_texts_per_s": best_tps,
    }


def _one_at_a_time(predictor: Any, texts: list[str], duration: float) -> list[float]:
    """The seconds of each batch-1 pass (tokenizing included) over ``duration`` seconds, sorted."""
    latencies: list[float] = []
    stop = time.perf_counter() + duration
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        predictor.predict_encoded(predictor.encode([texts[len(latencies) % len(texts)]]))
        latencies.append(time.perf_counter() - t0)
    return sorted(latencies)


def _throughput(
    lanes: list[Any], texts: list[str], window: int, size: int, max_batch_tokens: int | None, duration: float
) -> float:
    """Texts/s of ``lanes`` predictors at once (a thread each), each tokenizing windows of ``window`` texts and
    running them as the server's passes (``plan_passes``) for ``duration`` seconds."""
    from concurrent.futures import ThreadPoolExecutor

    from ..predict.batch_forming import plan_passes

    done = [0] * len(lanes)

    def run(lane: int) -> None:
        predictor, start = lanes[lane], 7919 * lane  # each lane on its own texts
        while True:  # a window at least, however late the thread starts
            chunk = [texts[(start + k) % len(texts)] for k in range(window)]
            start += window * len(lanes)
            encoded = predictor.encode(chunk)
            for indices in plan_passes([len(e) for e in encoded], size, max_batch_tokens):
                predictor.predict_encoded([encoded[k] for k in indices])
            done[lane] += len(chunk)
            if time.perf_counter() >= stop:
                return

    t0 = time.perf_counter()
    stop = t0 + duration
    if len(lanes) == 1:
        run(0)
    else:
        with ThreadPoolExecutor(len(lanes)) as pool:
            list(pool.map(run, range(len(lanes))))  # a lane's error is raised here
    return sum(done) / (time.perf_counter() - t0)


def empty_responder_command(port: int) -> list[str]:
    return [sys.executable, "-m", "distrinews.bench.serving_limit", "--port", str(port)]


def empty_app() -> Callable[..., Any]:
    """A raw ASGI app: reads the whole body, answers ``EMPTY_ANSWER`` (``/ready`` included)."""
    head = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(EMPTY_ANSWER)).encode())],
    }
    body = {"type": "http.response.body", "body": EMPTY_ANSWER}

    async def app(scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[Any], Any]) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body", False):  # the whole body read
            pass
        await send(head)
        await send(body)

    return app


def summarise(report: dict[str, Any], alone: dict[str, Any], runtime: str, busiest: int) -> dict[str, Any]:
    """The limit section of the report: the three floors side by side, the overhead, the share, the aims."""
    results = report["results"]
    ours_1 = find_result(results, "ours", runtime, "full", 1)
    ours_c = find_result(results, "ours", runtime, "full", busiest)
    empty_1 = find_result(results, "empty", "-", "full", 1)
    empty_c = find_result(results, "empty", "-", "full", busiest)
    n = usable_cores()  # the server's and the load generator's, shared
    out: dict[str, Any] = {"runtime": runtime, "cores": n, "concurrency": busiest, "runtime_alone": alone}
    out["empty_responder"] = {
        "p50_ms": empty_1["p50_ms"] if empty_1 else None,
        "throughput_rps": empty_c["throughput_rps"] if empty_c else None,
        "client_cpu_cores": empty_c.get("client_cpu_cores") if empty_c else None,
    }
    aims: list[dict[str, Any]] = []
    if ours_1 and empty_1:
        floor = alone["p50_ms"] + empty_1["p50_ms"]
        out["overhead_ms"] = ours_1["p50_ms"] - floor
        aims.append(
            {
                "aim": f"p50 at 1 client within {OVERHEAD_AIM_MS} ms of the runtime alone + the empty responder",
                "value": f"{ours_1['p50_ms']:.2f} ms against {floor:.2f} ms ({out['overhead_ms']:+.2f} ms)",
                "passed": out["overhead_ms"] <= OVERHEAD_AIM_MS,
            }
        )
    if ours_c:
        left = n - ours_c["client_cpu_cores"]
        scaled = alone["best_texts_per_s"] * left / n
        out.update(cores_left=left, runtime_scaled_texts_per_s=scaled, share=ours_c["throughput_rps"] / scaled)
        aims.append(
            {
                "aim": f"at {busiest} clients at least {SHARE_AIM:.0%} of the runtime alone on the cores left",
                "value": f"{ours_c['throughput_rps']:.1f} req/s against {scaled:.1f} texts/s on {left:.2f} of "
                f"{n} cores ({out['share']:.1%})",
                "passed": out["share"] >= SHARE_AIM,
            }
        )
    out["aims"] = aims
    return out


def add_seed_aim(report: dict[str, Any], ratios: list[dict[str, Any]]) -> None:
    """Where the seed-style server was loaded too: the aim against it, at the limit's runtime and level."""
    limit = report.get("limit")
    at = (limit["runtime"], limit["concurrency"]) if limit else None
    ratio = next((q for q in ratios if (q["runtime"], q["concurrency"]) == at), None)
    if limit is None or ratio is None:
        return
    limit["seed_ratio"] = ratio["throughput_ratio"]
    limit["aims"].append(
        {
            "aim": f"at {limit['concurrency']} clients at least {SEED_AIM:g}x the seed-style server",
            "value": f"{ratio['throughput_ratio']:.2f}x",
            "passed": ratio["throughput_ratio"] >= SEED_AIM,
        }
    )


def aim_lines(limit: dict[str, Any]) -> list[str]:
    return [f"{'PASS' if a['passed'] else 'FAIL'}  {a['aim']}: {a['value']}" for a in limit.get("aims", [])]


def markdown(limit: dict[str, Any]) -> list[str]:
    """The limit's section of ``serving.md``."""
    alone, empty = limit["runtime_alone"], limit["empty_responder"]
    c = limit["concurrency"]
    threads = alone["threads"] or "the runtime's default"
    lines = [
        "",
        f"## The limit ({alone['runtime']}"
        + (f", what {limit['runtime']} serves here)" if limit["runtime"] != alone["runtime"] else ")"),
        "",
        f"The runtime alone: the server's predictor in the benchmark's process (threads: {threads}), no HTTP, "
        "no queue, on the same texts; batches cut by the server's rule "
        f"(max_batch_tokens {alone['max_batch_tokens']}) from "
        + (
            f"at most {alone['in_flight']} texts at a time (what {c} clients keep in flight). "
            if alone.get("in_flight")
            else "the batcher's whole lookahead. "
        )
        + "The empty responder: uvicorn (h11) answering a fixed prediction-sized body, loaded like the servers.",
        "",
        f"| | p50 at 1 client (ms) | throughput at {c} clients |",
        "|---|---:|---:|",
        f"| runtime alone, batch 1 | {alone['p50_ms']:.2f} | {alone['texts_per_s'].get('1', float('nan')):.1f} "
        "texts/s |",
    ]
    for size, tps in alone["texts_per_s"].items():
        if size != "1":
            lines.append(f"| runtime alone, batch {size} | | {tps:.1f} texts/s |")
    side = alone.get("side_by_side_texts_per_s") or {}
    lanes = f"{alone.get('lanes')} single-threaded passes side by side"  # recorded wherever side is
    lines += [f"| runtime alone, {lanes}, batch {size} | | {tps:.1f} texts/s |" for size, tps in side.items()]
    if empty["p50_ms"] is not None:
        lines.append(
            f"| empty responder | {empty['p50_ms']:.2f} | {empty['throughput_rps'] or 0:.1f} req/s "
            f"(load generator: {empty['client_cpu_cores'] or 0:.2f} cores) |"
        )
    if "overhead_ms" in limit:
        lines.append(f"| our server's overhead | {limit['overhead_ms']:+.2f} | |")
    if "share" in limit:
        lines.append(
            f"| runtime alone (best batch) on the {limit['cores_left']:.2f} of {limit['cores']} cores the load "
            f"generator leaves | | {limit['runtime_scaled_texts_per_s']:.1f} texts/s |"
        )
        lines.append(f"| our server's share of it | | {limit['share']:.1%} |")
    if "seed_ratio" in limit:
        lines.append(f"| ours / the seed-style server | | {limit['seed_ratio']:.2f}x |")
    lines += ["", "Aims:", ""] + [f"- {line}" for line in aim_lines(limit)]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distrinews.bench.serving_limit", description="the empty responder")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    # log level info: with port 0, the listening line names the port (serving_servers.reported_port)
    uvicorn.run(empty_app(), host="127.0.0.1", port=args.port, http="h11", log_level="info", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

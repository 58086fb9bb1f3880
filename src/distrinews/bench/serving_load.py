"""The load generator of ``distrinews bench serving``: the request texts (AG News test rows, full and headlines
only), a minimal keep-alive HTTP client, and the closed loop that drives C such clients against one server (a
client answered 429 waits the ``Retry-After`` it was given), measured into latency percentiles, throughput and
429 counts; ``find_result`` picks one measured row back out of the results.
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import json
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class _Client:
    """A minimal HTTP/1.1 keep-alive client: the load generator must cost little CPU next to the server."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, float | None]:
        """(status, Retry-After seconds or None)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        assert self.reader is not None
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header.split(b" ", 2)[1])
        length, retry_after, chunked = 0, None, False
        for line in header.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"retry-after":
                retry_after = float(value)
            elif name.lower() == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        if chunked:  # a server that streams its answer (Ray Serve's proxy does)
            await self._skip_chunks()
        else:
            await self.reader.readexactly(length)
        if b"connection: close" in header.lower():
            self.close()
        return status, retry_after

    async def _skip_chunks(self) -> None:
        """Read a chunked body to its end: chunks (a hex size line, the bytes, CRLF), then the trailer's blank line."""
        assert self.reader is not None
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
            await self.reader.readexactly(size + 2)
        while await self.reader.readuntil(b"\r\n") != b"\r\n":
            pass

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def first_request(port: int, text: str, timeout: float = 600) -> None:
    """One untimed ``POST /predict``: what a server pays once (its first forward pass) stays out of every level."""
    import urllib.request

    body = json.dumps({"text": text}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        answer.read()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc; its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile_ms(sorted_seconds: list[float], q: float) -> float:
    """The q-quantile (nearest rank, no interpolation) of sorted latencies, in milliseconds."""
    if not sorted_seconds:
        return float("nan")
    return 1000 * sorted_seconds[min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))]


def seed_body(text: str) -> Any:
    """The body of our ``POST /predict``: one text."""
    return {"text": text}


@dataclass
class _Tally:
    """What one level's clients saw after the warm-up: answered latencies, 429s (and their Retry-After), errors."""

    latencies: list[float] = field(default_factory=list)
    rejected: list[float] = field(default_factory=list)
    retry_after_missing: int = 0
    errors: int = 0

    def add(self, status: int, retry_after: float | None, seconds: float) -> None:
        if status == 200:
            self.latencies.append(seconds)
        elif status == 429:
            self.rejected.append(seconds)
            self.retry_after_missing += retry_after is None
        else:
            self.errors += 1

    def summary(self, concurrency: int, duration: float) -> dict[str, Any]:
        latencies, rejected = sorted(self.latencies), sorted(self.rejected)
        return {
            "concurrency": concurrency,
            "requests": len(latencies),
            "rejected_429": len(rejected),
            "rejected_p50_ms": percentile_ms(rejected, 0.50),
            "rejected_p99_ms": percentile_ms(rejected, 0.99),
            "retry_after_missing": self.retry_after_missing,
            "errors": self.errors,
            "duration_s": duration,
            "throughput_rps": len(latencies) / duration,
            "p50_ms": percentile_ms(latencies, 0.50),
            "p95_ms": percentile_ms(latencies, 0.95),
            "p99_ms": percentile_ms(latencies, 0.99),
            "mean_ms": 1000 * statistics.fmean(latencies) if latencies else float("nan"),
        }


async def closed_loop(
    port: int,
    texts: list[str],
    concurrency: int,
    duration: float,
    warmup: float,
    path: str = "/predict",
    body: Callable[[str], Any] = seed_body,
) -> dict[str, Any]:
    """One level: ``concurrency`` clients, each sending the next request once answered, for ``warmup`` + ``duration``
    seconds; the figures count only requests sent after the warm-up. Each request is ``POST path`` with the JSON of
    ``body(text)`` (another server's shape for one text, where it takes no other)."""
    bodies = [json.dumps(body(t)).encode() for t in texts]
    tally = _Tally()
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from, stop_at = start + warmup, start + warmup + duration

    async def worker(k: int) -> None:
        client = _Client(port)
        i = k
        try:
            while (t0 := loop.time()) < stop_at:
                try:
                    status, retry_after = await client.post(path, bodies[i % len(bodies)])
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError):
                    status, retry_after = 0, None  # no answer, or one that is not HTTP: an error, on a new connection
                    client.close()
                if t0 >= measure_from:
                    tally.add(status, retry_after, loop.time() - t0)
                i += concurrency
                if status == 429:  # back off as told (never past the end of the run)
                    await asyncio.sleep(max(0.0, min(retry_after or 1.0, stop_at - loop.time())))
        finally:
            client.close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return tally.summary(concurrency, duration)


def load_texts(data_dir: str | None, n: int) -> tuple[list[str], list[str]]:
    """(full texts = title + description as the model sees them, headlines = titles), from the test split."""
    from ..data.splits import load_split
    from .results import agnews_dir

    directory = agnews_dir(data_dir, "the serving benchmarks need AG News for their request texts")
    full = load_split(directory, "test").texts[:n]
    path = Path(directory) / "test.csv.gz"
    opener = gzip.open if path.is_file() else open
    path = path if path.is_file() else Path(directory) / "test.csv"
    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        headlines = [row[1].strip() for _, row in zip(range(n), csv.reader(fh))]
    return full, headlines


def find_result(
    results: list[dict[str, Any]], server: str, runtime: str, texts: str, c: int, max_queue: int | None = None
) -> dict[str, Any] | None:
    """The result of one server, runtime, text kind and concurrency (and overload queue), or None."""
    wanted = (server, runtime, texts, c, max_queue)
    found = (
        r for r in results if (r["server"], r["runtime"], r["texts"], r["concurrency"], r.get("max_queue")) == wanted
    )
    return next(found, None)

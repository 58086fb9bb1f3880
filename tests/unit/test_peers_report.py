"""The peer benchmark's arithmetic and report (benchmarks/tools/peers/report.py), and the load generator's client
against a server that answers in chunks, as Ray Serve's proxy does."""

from __future__ import annotations

import asyncio
import math

import pytest

from benchmarks.tools.peers import report
from distrinews.bench.serving_load import closed_loop


def _row(server: str, c: int, round_no: int, rps: float, p50: float, errors: int = 0) -> dict:
    return {
        "server": server,
        "concurrency": c,
        "round": round_no,
        "throughput_rps": rps,
        "p50_ms": p50,
        "p99_ms": 2 * p50,
        "cpu_ms_per_request": 1000 / rps,
        "requests": int(rps * 10),
        "errors": errors,
        "rejected_429": 0,
    }


RESULTS = [
    _row("ours", 1, 1, 200, 5),
    _row("litserve", 1, 1, 100, 8, errors=1),
    _row("ours", 1, 2, 220, 4),
    _row("litserve", 1, 2, 120, 10, errors=2),
    _row("ours", 4, 1, 400, 9),
    _row("litserve", 4, 1, 160, 20),
]


def test_the_summary_takes_medians_over_rounds_and_adds_up_the_counts():
    rows = {(r["server"], r["concurrency"]): r for r in report.summarise(RESULTS)}
    assert list(rows) == [("ours", 1), ("litserve", 1), ("ours", 4), ("litserve", 4)]  # as first measured
    ours, lit = rows["ours", 1], rows["litserve", 1]
    assert (ours["throughput_rps"], ours["p50_ms"], ours["p99_ms"], ours["rounds"]) == (210, 4.5, 9, 2)
    assert (lit["errors"], lit["requests"], rows["litserve", 4]["rounds"]) == (3, 2200, 1)


def test_ours_against_each_peer_at_each_client_count():
    ratios = {(q["peer"], q["concurrency"]): q for q in report.against_ours(report.summarise(RESULTS))}
    assert set(ratios) == {("litserve", 1), ("litserve", 4)}
    assert ratios["litserve", 1]["throughput_ratio"] == pytest.approx(210 / 110)
    assert ratios["litserve", 1]["p50_ratio"] == pytest.approx(4.5 / 9)
    assert ratios["litserve", 4]["p99_ratio"] == pytest.approx(18 / 40)
    assert math.isnan(report.ratio(1.0, 0.0))


def test_the_table_has_a_row_per_server_and_client_count_with_the_ratios():
    summary = report.summarise(RESULTS)
    built = {
        "command": "python -m benchmarks.tools.peers run",
        "machine": {"cpu": "a CPU", "cores_available": 2},
        "settings": {"rounds": 2, "duration_s": 3.0, "warmup_s": 1.0, "texts": 50, "clients": [1, 4]},
        "servers": ["ours", "litserve"],
        "served": {"ours": {"model": {"runtime": "onnx-int8"}}, "litserve": {"config": {"LitAPI": {}}}},
        "peers_python": "python",
        "versions": report.key_versions(["litserve==0.2.19", "Ray==2.60.0", "unrelated==1", "-e git+x#egg=y"]),
        "summary": summary,
        "ours_vs_peers": report.against_ours(summary),
    }
    assert built["versions"] == {"litserve": "0.2.19", "ray": "2.60.0"}
    table = report.markdown(built)
    assert "| ours | 1 | 210.0 | 4.50 | 9.00 | 0 | 0 | 4.77 | - | - |" in table
    assert "| litserve | 1 | 110.0 | 9.00 | 18.00 | 3 | 0 | 9.17 | 1.91 | 0.50 |" in table
    assert "litserve 0.2.19, ray 2.60.0" in table


# Two chunks (one with an extension), the last chunk, no trailer: {"a":1}
CHUNKED = b'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;x=1\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'


def test_the_client_reads_chunked_answers_to_their_end():
    """A chunked answer read as an empty one left its chunks to be read as the next answer's head: the run died."""

    async def main() -> dict:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if b"length" in line.lower())
                    await reader.readexactly(length)
                    writer.write(CHUNKED)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await closed_loop(port, ["a text", "another"], 2, duration=0.3, warmup=0)

    result = asyncio.run(main())
    assert result["requests"] > 2 and result["errors"] == 0

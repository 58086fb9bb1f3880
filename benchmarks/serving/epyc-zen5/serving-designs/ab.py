"""A/B: `distrinews serve` from two checkouts, alternated; req/s at C clients and server CPU cores."""

import asyncio
import json
import os
import subprocess
import sys
import time

from distrinews.bench.serving_load import closed_loop, first_request, load_texts, process_cpu_seconds
from distrinews.bench.serving_servers import wait_ready

ckpt = sys.argv[1]
trees = sys.argv[2].split(",")
rounds = int(sys.argv[3])
levels = [int(c) for c in sys.argv[4].split(",")]
dur = float(os.environ.get("DUR", 10))
texts, _ = load_texts(os.environ["DISTRINEWS_DATA"], 512)
out = {}
for r in range(rounds):
    for k, tree in enumerate(trees):
        port = 18700 + 10 * r + k
        path, *spec = tree.split("|")
        extra = [a for a in spec if a.startswith("--")]
        extra = [x for a in extra for x in a.split()]
        settings = dict(a.split("=", 1) for a in spec if not a.startswith("--"))  # may replace PYTHONPATH
        env = {**os.environ, "PYTHONPATH": f"{path}/src", **settings}
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "distrinews",
                "serve",
                "--checkpoint",
                ckpt,
                "--port",
                str(port),
                "--no-access-log",
                *extra,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(f"/tmp/ab-{k}.log", "w"),
        )
        wait_ready(f"http://127.0.0.1:{port}/ready", p)
        first_request(port, texts[0])
        for c in levels:
            asyncio.run(closed_loop(port, texts, c, 2, 0))
            c0, t0 = process_cpu_seconds(p.pid), time.perf_counter()
            res = asyncio.run(closed_loop(port, texts, c, dur, 0))
            cores = (process_cpu_seconds(p.pid) - c0) / (time.perf_counter() - t0)
            line = (
                f"round {r} {tree[-22:]:22s} c={c:2d}: {res['throughput_rps']:6.1f} req/s p50 {res['p50_ms']:5.2f} ms "
                f"p99 {res['p99_ms']:6.1f} ms server {cores:.2f} cores"
            )
            print(line, flush=True)
            out.setdefault(f"{tree} c={c}", []).append(round(res["throughput_rps"], 1))
        p.terminate()
        p.wait()
print(json.dumps(out, indent=1))

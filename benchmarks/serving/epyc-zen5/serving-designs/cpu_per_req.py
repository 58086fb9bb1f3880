"""Server CPU microseconds per request, empty app, 32 keep-alive clients: h11 guarded vs httptools vs uvloop."""

import asyncio
import json
import subprocess
import sys
import time

from distrinews.bench.serving_load import closed_loop, process_cpu_seconds

SERVER = r"""
import sys, uvicorn
from distrinews.bench.serving_limit import empty_app
from distrinews.serve.connections import guarded_protocol
http, loop, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if http == "h11g": http = guarded_protocol(10, 1000, 10)
uvicorn.run(empty_app(), host="127.0.0.1", port=port, http=http, loop=loop, log_level="warning", access_log=False)
"""
results = {}
for rnd in range(2):
    for http, loop in [
        ("h11g", "asyncio"),
        ("h11", "asyncio"),
        ("httptools", "asyncio"),
        ("h11g", "uvloop"),
        ("httptools", "uvloop"),
    ]:
        port = 18500 + rnd * 10 + len(results) % 10
        p = subprocess.Popen([sys.executable, "-c", SERVER, http, loop, str(port)])
        time.sleep(3)
        asyncio.run(closed_loop(port, ["x" * 200], 32, 1, 0))
        c0 = process_cpu_seconds(p.pid)
        r = asyncio.run(closed_loop(port, ["Oil prices jump as supply falls " * 6], 32, 4, 0))
        c1 = process_cpu_seconds(p.pid)
        p.terminate()
        p.wait()
        us = 1e6 * (c1 - c0) / r["requests"]
        results.setdefault(f"{http}/{loop}", []).append(round(us, 1))
        print(http, loop, r["requests"], f"{us:.1f} us/req", flush=True)
print(json.dumps(results))

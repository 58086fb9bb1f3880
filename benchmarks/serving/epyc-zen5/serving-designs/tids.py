import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from distrinews.bench.serving_load import closed_loop, first_request, load_texts
from distrinews.bench.serving_servers import wait_ready

ckpt, tree, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = dict(os.environ, PYTHONPATH=f"{tree}/src")
p = subprocess.Popen(
    [sys.executable, "-m", "distrinews", "serve", "--checkpoint", ckpt, "--port", str(port), "--no-access-log"],
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=open("/tmp/tids.log", "w"),
)
wait_ready(f"http://127.0.0.1:{port}/ready", p)
texts, _ = load_texts(os.environ["DISTRINEWS_DATA"], 512)
first_request(port, texts[0])
asyncio.run(closed_loop(port, texts, 32, 3, 0))
dump = subprocess.run(["py-spy", "dump", "-p", str(p.pid)], capture_output=True, text=True).stdout
names = {}
for line in dump.splitlines():
    m = re.match(r'Thread (\S+) \((\w+)\)(?: "([^"]*)")?', line)
    if m:
        tid = int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
        names[tid] = m.group(3) or "?"


def cpu():
    out = {}
    for t in Path(f"/proc/{p.pid}/task").iterdir():
        f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(t.name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out


a = cpu()
t0 = time.perf_counter()
r = asyncio.run(closed_loop(port, texts, 32, 10, 0))
b = cpu()
el = time.perf_counter() - t0
p.terminate()
p.wait()
print(f"{r['throughput_rps']:.1f} req/s")
rows = sorted(((b[t] - a.get(t, 0)) / el, t) for t in b)
for c, t in reversed(rows):
    if c > 0.005:
        print(f"{t:8d} {names.get(t, 'native'):28s} {c:.3f} cores")
print(f"total {sum(c for c, _ in rows):.3f} cores")

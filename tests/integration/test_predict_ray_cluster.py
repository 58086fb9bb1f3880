"""``distrinews predict --engine ray`` on a two-node Ray cluster, as a team runs it: ``ray start --head`` on test
host A, ``ray start --address`` on test host B (conftest ``made_test_hosts``: network namespaces joined by a veth
pair), and the job's driver on A with ``--ray-address``; one CPU and a small object store a node.

- The job runs on both nodes (its summary names each node and its rows), and its answers are the local engine's.
- Host B is lost while its actor labels a window of the job (every process on it SIGKILLed, as a machine that
  dies): the job still finishes, every row once, with the local engine's labels; only host A is named.

The checkpoint and the corpus are at the same path on both hosts (one file system), as shared storage gives a
cluster. Every Ray process is killed with its host at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (
    ROOT,
    host_pids,
    in_host,
    killed_after,
    made_test_hosts,
    news_rows,
    require,
    stop_host,
    wait_until,
)

ROWS = 2000
ATOL = 1e-5
PORT = 6379
# Each node: one CPU (one actor of --nproc 2), an object store of Ray's smallest useful size
NODE = ("--num-cpus", "1", "--object-store-memory", str(100 << 20), "--disable-usage-stats")
# A lost node is declared dead after ~5 s without an answer (Ray's default: ~15 s), so its work is rescheduled soon
HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}
# The job's actors all start before the first window is handed out, so both nodes label some (else the first actor
# up may take them all)
WHOLE_POOL = {"RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S": "300"}
# 4 texts a pass, windows of 32 rows: 63 windows to share out
OPTIONS = (
    "--batch-size",
    "4",
    "--max-batch-tokens",
    "96",
    "--id-field",
    "key",
    "--probabilities",
    "--progress",
    "lines",
)
# An actor reserves --threads CPUs: one, as each node has (the default divides this machine's cores)
ACTORS = ("--nproc", "2", "--threads", "1")
WORKER = "ray::MapWorker(MapBatches(WindowPredictor))"  # the title Ray gives the job's actor processes


def _ray() -> Path:
    """The ``ray`` command of this environment, once Ray Data imports."""
    require("ray.data", "--engine ray needs Ray Data: pip install 'distrinews[ray]'")
    return Path(sys.executable).with_name("ray")


def _started(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def cluster():
    """``(address, [(netns, veth, address)] * 2, env)``: a Ray head on host A, a worker node on host B, and the
    environment that joins them (the cluster's token)."""
    ray = _ray()
    with made_test_hosts() as hosts, contextlib.ExitStack() as cleanup:
        (host_a, _, addr_a), (host_b, _, addr_b) = hosts
        # A folder of each node's own, with a short path: Ray's socket paths must fit in 107 bytes
        temp = [tempfile.mkdtemp(prefix="dn-ray-") for _ in hosts]
        for folder in temp:
            cleanup.callback(shutil.rmtree, folder, True)
        for host, _, _ in hosts:  # first, then the folders they write in (an ExitStack unwinds last in, first out)
            cleanup.callback(stop_host, host)
        # Token authentication, as a team's cluster has it: the token given to every node and to the job. Ray's
        # default depends on whether ~/.ray/auth_token exists (a local ray.init() writes one): never left to it.
        token = Path(temp[0]) / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        head = ("--head", "--node-ip-address", addr_a, "--port", str(PORT), "--include-dashboard", "false")
        _started(in_host(host_a, str(ray), "start", *head, *NODE, "--temp-dir", temp[0]), {**env, **HEALTH})
        address = f"{addr_a}:{PORT}"
        joined = ("--address", address, "--node-ip-address", addr_b)
        _started(in_host(host_b, str(ray), "start", *joined, *NODE, "--temp-dir", temp[1]), env)
        yield address, hosts, env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, spread_checkpoint):
    """``(checkpoint, corpus, local_output)``: ``ROWS`` news rows, and the local engine's labels of them."""
    import torch

    from distrinews.predict.batch import engine
    from distrinews.predict.batch.job import BatchJob
    from distrinews.predict.predictor import Predictor

    root = tmp_path_factory.mktemp("ray-cluster")
    texts = [f"{title}. {description}" for _, title, description in news_rows(ROWS, random.Random(7))]
    checkpoint = spread_checkpoint(root / "best", texts[:64])
    corpus = root / "news.jsonl"
    corpus.write_text("".join(json.dumps({"key": f"k{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    output = root / "local.jsonl"
    job = BatchJob(
        checkpoint=str(checkpoint),
        inputs=[str(corpus)],
        output=str(output),
        batch_size=4,
        max_batch_tokens=96,
        id_field="key",
        probabilities=True,
        runtime="torch",
        progress="none",
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert engine.run(job, stdout=io.StringIO(), stderr=io.StringIO(), predictor=Predictor(checkpoint)) == 0
    finally:
        torch.set_num_threads(threads)
    return checkpoint, corpus, output


def _driver(
    host: str, address: str, env: dict[str, str], checkpoint: Path, corpus: Path, output: Path, log: Path
) -> subprocess.Popen:
    command = in_host(
        host,
        sys.executable, "-m", "distrinews", "predict",
        "--checkpoint", str(checkpoint),
        "--input", str(corpus),
        "--output", str(output),
        "--engine", "ray",
        "--ray-address", address,
        *ACTORS,
        "--runtime", "torch",
        *OPTIONS,
    )  # fmt: skip
    with open(log, "w") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **env, **WHOLE_POOL}
        )


def _same_answers(output: Path, local: Path) -> None:
    got = [json.loads(line) for line in output.read_text().splitlines()]
    want = [json.loads(line) for line in local.read_text().splitlines()]
    assert [r["id"] for r in got] == [f"k{i}" for i in range(ROWS)]  # every row once, in input order
    assert [r["label"] for r in got] == [r["label"] for r in want]
    assert len({r["label"] for r in got}) > 1  # the answers depend on the text
    for mine, theirs in zip(got, want):
        assert list(mine["probabilities"].values()) == pytest.approx(
            list(theirs["probabilities"].values()), abs=ATOL, rel=0
        )


def _ran_on(log: str) -> str:
    return next(line for line in log.splitlines() if line.startswith("predict: computed on "))


def test_a_job_labels_on_both_nodes_of_the_cluster(cluster, corpus, tmp_path):
    address, ((host_a, _, addr_a), (_, _, addr_b)), env = cluster
    checkpoint, news, local = corpus
    output, log = tmp_path / "labels.jsonl", tmp_path / "driver.log"
    with killed_after(_driver(host_a, address, env, checkpoint, news, output, log)) as driver:
        driver.wait(400)
    printed = log.read_text()
    assert driver.returncode == 0, printed[-6000:]
    assert "Ray engine, 2 actors x 1 CPU (2 nodes, 2 CPUs)" in printed, printed[-6000:]
    line = _ran_on(printed)
    assert (
        line.startswith("predict: computed on 2 nodes: ") and f"{addr_a} (node " in line and f"{addr_b} (node " in line
    )
    assert f"predict: {ROWS:,} rows read, {ROWS:,} labelled, 0 rejected" in printed
    _same_answers(output, local)
    print(printed)


class Labelling:
    """``check()``: whether an actor of the job on ``host`` is in one of its calls, labelling a window (Ray titles an
    actor's process ``...).__init__`` while it loads, ``...).submit`` while it computes). Its processes are listed
    anew every 0.2 s, their titles read at every check; the job's end (``driver``) ends the wait."""

    def __init__(self, host: str, driver: subprocess.Popen):
        self.host, self.driver, self.pids, self.listed = host, driver, list[int](), 0.0

    def _title(self, pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            return ""

    def check(self) -> bool:
        assert self.driver.poll() is None, "the job ended before host B labelled a window"
        if time.monotonic() - self.listed > 0.2:
            self.pids = [p for p in host_pids(self.host) if self._title(p).startswith(WORKER)]
            self.listed = time.monotonic()
        titles = [self._title(pid) for pid in self.pids]
        return any(t.startswith(WORKER + ".") and not t.endswith(".__init__") for t in titles)


def test_a_node_lost_mid_job_costs_its_windows_not_the_job(cluster, corpus, tmp_path):
    address, ((host_a, _, addr_a), (host_b, _, addr_b)), env = cluster
    checkpoint, news, local = corpus
    output, log = tmp_path / "labels.jsonl", tmp_path / "driver.log"
    with killed_after(_driver(host_a, address, env, checkpoint, news, output, log)) as driver:
        wait_until(Labelling(host_b, driver).check, 240, "host B's actor to label a window", interval=0.002)
        stop_host(host_b)  # the machine is gone: its raylet, its object store, the actor mid-window
        lost_at = time.monotonic()
        assert driver.poll() is None and not output.exists()  # mid-job: nothing published yet
        driver.wait(400)
        recovered_in = time.monotonic() - lost_at
    printed = log.read_text()
    assert driver.returncode == 0, printed[-6000:]
    # Host A computed what host B had not handed back (B is named too if some of its windows had reached the driver)
    assert f"{addr_a} (node " in _ran_on(printed), printed[-6000:]
    assert addr_b in printed.replace(_ran_on(printed), "")  # Ray's own lines name the node lost
    assert f"predict: {ROWS:,} rows read, {ROWS:,} labelled, 0 rejected" in printed
    _same_answers(output, local)
    print(f"host B lost; the job ended {recovered_in:.0f} s later\n{printed}")

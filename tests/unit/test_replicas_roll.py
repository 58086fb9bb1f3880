"""The rolling restart's schedule (``serve-replicas``, SIGHUP), with replicas stood in by objects that record when
they stop, start and get ready: one replica is away at a time, and only once nginx routes to every other one.

nginx rests a replica that failed a request for ``fail_timeout``, counted on a clock of whole seconds, so a
replica is surely back in its rotation only ``fail_timeout`` + 1 s after it got ready. The real processes and
nginx are exercised in ``tests/integration/test_serve_replicas.py``.
"""

from __future__ import annotations

import pytest

from distrinews.serve import replicas as replicas_module
from distrinews.serve.replicas import ReplicaSettings, Supervisor

FAIL_TIMEOUT = 0.2


class Clock:
    """Virtual time: the supervisor's sleeps advance it at once."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


clock = Clock()


@pytest.fixture(autouse=True)
def virtual_time(monkeypatch):
    monkeypatch.setattr(replicas_module, "time", clock)


class FakeReplica:
    def __init__(self, index: int, events: list, load_seconds: float = 0.05, ready_since: float | None = None):
        self.index, self.port, self.events, self.load_seconds = index, 10000 + index, events, load_seconds
        self.checkpoint, self.failures, self.log_path = "v1", 0, f"replica-{index}.log"
        self.started_at, self.ready_since, self.running = clock.monotonic(), ready_since, True

    def alive(self) -> bool:
        return self.running

    def seen_ready(self) -> bool:
        if self.ready_since is None and self.running and clock.monotonic() - self.started_at >= self.load_seconds:
            self.ready_since = clock.monotonic()
            self.events.append((self.ready_since, "ready", self.index))
        return self.ready_since is not None

    def stop(self, timeout: float = 60.0) -> None:
        self.running = False
        self.events.append((clock.monotonic(), "stop", self.index))

    def start(self, checkpoint: str) -> None:
        self.checkpoint, self.running, self.started_at, self.ready_since = checkpoint, True, clock.monotonic(), None


def _supervisor(tmp_path, replicas: list[FakeReplica]) -> Supervisor:
    settings = ReplicaSettings(
        checkpoint=str(tmp_path), replicas=len(replicas), fail_timeout=FAIL_TIMEOUT, ready_timeout=10
    )
    supervisor = Supervisor(settings)
    supervisor.replicas = replicas
    supervisor._version = lambda replica: "2.0.0"
    supervisor.say = lambda message: None
    return supervisor


def _stops_and_readies(events: list) -> tuple[dict[int, float], dict[int, float]]:
    stops = {i: t for t, what, i in events if what == "stop"}
    readies = {i: t for t, what, i in events if what == "ready"}
    return stops, readies


def test_the_next_replica_goes_only_once_nginx_has_the_new_one_back(tmp_path):
    events: list = []
    long_ago = clock.monotonic() - 100
    replicas = [FakeReplica(i, events, ready_since=long_ago) for i in range(3)]
    _supervisor(tmp_path, replicas).roll()
    stops, readies = _stops_and_readies(events)
    assert sorted(stops) == sorted(readies) == [0, 1, 2]
    assert stops[0] < readies[0] < stops[1] < readies[1] < stops[2] < readies[2]  # one away at a time
    for previous, following in ((0, 1), (1, 2)):
        assert stops[following] - readies[previous] >= FAIL_TIMEOUT + 1.0, (
            "stopped while nginx may still rest the new one"
        )


def test_a_replica_started_again_after_a_crash_is_back_in_rotation_before_another_goes(tmp_path):
    events: list = []
    fresh = FakeReplica(1, events, ready_since=clock.monotonic())  # revived by the supervisor a moment ago
    revived_ready_at = fresh.ready_since
    replicas = [FakeReplica(0, events, ready_since=clock.monotonic() - 100), fresh]
    _supervisor(tmp_path, replicas).roll()
    stops, _ = _stops_and_readies(events)
    assert stops[0] - revived_ready_at >= FAIL_TIMEOUT + 1.0


def test_a_roll_waits_for_a_replica_still_loading_and_says_done_when_all_are_back(tmp_path):
    events: list = []
    loading = FakeReplica(1, events, load_seconds=0.3)
    replicas = [FakeReplica(0, events, ready_since=clock.monotonic() - 100), loading]
    said: list[str] = []
    supervisor = _supervisor(tmp_path, replicas)
    supervisor.say = said.append
    supervisor.roll()
    first_ready = next(t for t, what, i in events if what == "ready" and i == 1)
    assert first_ready < min(t for t, what, _ in events if what == "stop"), (
        "a replica stopped while replica 1 was loading"
    )
    assert said[-1] == "rolling restart done"
    assert all(clock.monotonic() - r.ready_since >= FAIL_TIMEOUT + 1.0 for r in replicas)

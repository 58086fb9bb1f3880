"""The hang detector: a peer that starts late is not a hang, a peer that goes silent is named."""

from __future__ import annotations

import datetime
import json
import os
import time

import pytest
import torch
import torch.distributed as dist

from conftest import wait_until
from distrinews.distributed.process_group import DistEnv
from distrinews.distributed.watchdog import Watchdog


@pytest.fixture
def store(monkeypatch):
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=5)
    )
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(master.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "unit")
    yield master
    del master


def _watchdog(rank: int, timeout_s: float, failures: list[str]) -> Watchdog:
    env = DistEnv(
        rank=rank, local_rank=rank, world_size=2, local_world_size=2, device=torch.device("cpu"), backend="gloo"
    )
    wd = Watchdog(env, timeout_s=timeout_s, progress=lambda: 7, interval_s=0.1)
    # a store client whose requests give up after half a second, as a loaded machine's would after 20 s
    wd._connect = lambda: dist.TCPStore(
        "127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=0.5)
    )
    wd._fail = failures.append  # record instead of os._exit
    return wd


def _beats(store, rank: int) -> int:
    """How many heartbeats ``rank``'s watchdog has written (0 before the first)."""
    key = f"distrinews/heartbeat/unit/0/{rank}"
    return json.loads(store.get(key))["beat"] if store.check([key]) else 0


def test_a_peer_that_starts_later_than_a_store_request_waits_is_not_a_hang(store):
    failures: list[str] = []
    with _watchdog(0, timeout_s=30, failures=failures):
        # rank 1 has not started its watchdog for 20 of rank 0's beats: four of its store client's timeouts long
        wait_until(lambda: _beats(store, 0) >= 20, 60, "20 heartbeats of rank 0")
        store.set("distrinews/heartbeat/unit/0/1", json.dumps({"beat": 1, "step": 0}))
        seen = _beats(store, 0)
        wait_until(lambda: _beats(store, 0) >= seen + 5, 60, "5 more heartbeats of rank 0, rank 1's in the store")
    assert failures == []


def test_a_silent_peer_is_named_with_its_last_step(store):
    failures: list[str] = []
    store.set("distrinews/heartbeat/unit/0/1", json.dumps({"beat": 1, "step": 41}))
    with _watchdog(0, timeout_s=1.0, failures=failures):
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.1)
    assert failures, "the silent rank was never reported"
    assert "rank(s) 1 stopped answering" in failures[0]
    assert "rank 1 last reported step 41" in failures[0]


def test_a_peer_that_never_reports_is_named_too(store):
    failures: list[str] = []
    with _watchdog(0, timeout_s=1.0, failures=failures):
        deadline = time.monotonic() + 10
        while not failures and time.monotonic() < deadline:
            time.sleep(0.1)
    assert failures and "rank 1 never reported" in failures[0]

"""The cores a process can use: its affinity, and no more than its cgroup's CPU quota (``podman run --cpus 2`` on a
big host), read from fake cgroup v2 and v1 files under a root folder; and the server's lanes sized from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from distrinews.distributed import machine


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def eight_cores(monkeypatch):
    """An affinity of 8 cores, whatever this machine has."""
    monkeypatch.setattr(machine, "cores_available", lambda: list(range(8)))


@pytest.mark.parametrize(
    ("files", "quota", "usable"),
    [
        # cgroup v2 in a container (its own cgroup is the mount's root): podman run --cpus 2
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "200000 100000\n"}, 2.0, 2),
        # --cpus 1.5: two threads are kept busy part of the time
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "150000 100000\n"}, 1.5, 2),
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "max 100000\n"}, None, 8),
        # a quota larger than the affinity: the affinity
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "1600000 100000\n"}, 16.0, 8),
        # cgroup v2 on a host: the process's cgroup has none, the slice above it has 3
        (
            {
                "proc/self/cgroup": "0::/app.slice/job.service\n",
                "sys/fs/cgroup/app.slice/job.service/cpu.max": "max 100000\n",
                "sys/fs/cgroup/app.slice/cpu.max": "300000 100000\n",
            },
            3.0,
            3,
        ),
        # cgroup v1 (docker on an older host), cpu and cpuacct mounted together
        (
            {
                "proc/self/cgroup": "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "100000\n",
                "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            },
            1.0,
            1,
        ),
        # cgroup v1 without a quota (-1)
        (
            {
                "proc/self/cgroup": "1:cpu:/\n",
                "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
                "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            },
            None,
            8,
        ),
        # nothing readable, or nonsense: the affinity
        ({}, None, 8),
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "two cores\n"}, None, 8),
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "200000 0\n"}, None, 8),
    ],
)
def test_usable_cores_are_the_affinity_bounded_by_the_cpu_quota(tmp_path, eight_cores, files, quota, usable):
    root = _files(tmp_path, files)
    assert machine.cpu_quota(root) == quota
    assert machine.usable_cores(root) == usable
    assert machine.quota_limited_cores(root) == (usable if usable < 8 else None)


def test_threads_and_the_servers_lanes_are_sized_from_the_quota_not_the_affinity(tmp_path, eight_cores, monkeypatch):
    """``podman run --cpus 2`` on an 8-core host: 2 lanes of one core each, 2 threads for the wide pass."""
    from distrinews.serve.options import ServeConfig
    from distrinews.serve.state import concurrent_passes, default_factory

    root = _files(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "200000 100000\n"})
    monkeypatch.setattr(machine, "SYSTEM_ROOT", root)

    class Onnx:
        runtime = "onnx"

        def single_threaded(self):
            return self

    assert concurrent_passes(ServeConfig(checkpoint="unused"), Onnx()) == 2  # type: ignore[arg-type]
    assert machine.threads_per_process(1) == 2 and machine.threads_per_process(2) == 1

    asked = {}

    def make_predictor(checkpoint, **kwargs):
        asked.update(kwargs)
        return Onnx()

    import distrinews.predict.runtimes as runtimes

    monkeypatch.setattr(runtimes, "make_predictor", make_predictor)
    default_factory(ServeConfig(checkpoint="unused", runtime="onnx"))()
    assert asked["threads"] == 2
    default_factory(ServeConfig(checkpoint="unused", runtime="onnx", threads=5))()
    assert asked["threads"] == 5

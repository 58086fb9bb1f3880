"""``distrinews doctor``: passes on a healthy setup, and fails with advice a person can act on."""

from __future__ import annotations

import json
import socket

from distrinews.cli.doctor import checks as doctor


def test_healthy_two_process_rendezvous(tmp_path, cli):
    proc = cli("doctor", "--nproc", "2", "--bandwidth-mb", "1", "--timeout", "60", "--json", str(tmp_path / "d.json"))
    out = proc.stdout
    assert "torch " in out and "backends: distributed yes, gloo yes" in out
    assert "free port found: 127.0.0.1:" in out
    assert "rendezvous of 2 processes (gloo" in out
    for op in ("all_reduce", "all_gather", "broadcast"):
        assert f"[ OK ] {op} correct on every rank" in out
    assert "busbw" in out and "All checks passed." in out
    assert "[ OK ] shared-memory gradient average of 1 MiB (what training uses here, ddp_comm_hook auto): " in out
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["ok"] is True and report["advice"] == []
    ranks = report["rendezvous"]
    assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["checks"]["all_reduce"]["got"] == 3.0
    assert [r["shared_memory"]["got"] for r in ranks] == [1.5, 1.5] and ranks[0]["shared_memory"]["ok"] is True


def test_port_in_use_is_named_with_advice(cli):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = cli("doctor", "--nproc", "2", "--port", str(port), "--timeout", "5", check=False)
    assert proc.returncode == 1
    assert f"[FAIL] port {port} on 127.0.0.1 cannot be bound" in proc.stdout
    assert (
        "What to do:" in proc.stdout
        and f"ss -ltnp | grep :{port}" in proc.stdout
        and "pick another port" in proc.stdout
    )


def test_a_rank_that_never_joins_times_out_with_advice(cli):
    proc = cli("doctor", "--nproc", "2", "--start-ranks", "1", "--timeout", "2", check=False)
    assert proc.returncode == 1
    assert "started 1 of 2 ranks" in proc.stdout
    assert "failed in phase 'rendezvous'" in proc.stdout
    assert "rank(s) 1 never joined the rendezvous" in proc.stdout and "within 2s" in proc.stdout
    assert "same MASTER_ADDR:MASTER_PORT" in proc.stdout


def test_under_torchrun_with_nproc_per_node(cli):
    proc = cli("doctor", "--bandwidth-mb", "1", nproc=2)
    assert proc.stdout.count("distrinews doctor") == 1  # rank 0 reports, once
    assert "torchrun launched 2 processes" in proc.stdout
    assert "[ OK ] all_reduce correct on every rank (got 3.0, expected 3.0)" in proc.stdout
    assert "All checks passed." in proc.stdout


def test_advice_for_each_failure_kind():
    in_use = doctor.advise("rendezvous", "RuntimeError: [Errno 98] Address already in use", "127.0.0.1", 29500, 30, [])
    assert "29500" in in_use and "in use" in in_use and "free port" in in_use
    missing = doctor.advise(
        "rendezvous",
        "DistStoreError: Timed out after 30 seconds waiting for clients. 1/2 clients joined.",
        "10.0.0.1",
        29500,
        30,
        [1],
    )
    assert "rank(s) 1 never joined" in missing and "10.0.0.1:29500" in missing and "firewall" in missing
    timeout = doctor.advise("all_reduce", "timed out", "10.0.0.1", 29500, 30, [])
    assert "timed out after 30s during 'all_reduce'" in timeout and "NCCL_DEBUG=INFO" in timeout
    nccl = doctor.advise("all_reduce", "NCCL error: unhandled system error", "h", 1, 30, [])
    assert "CUDA_VISIBLE_DEVICES" in nccl and "NCCL_DEBUG=INFO" in nccl


def test_port_free_tells_a_taken_port_from_a_free_one():
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        free, why = doctor.port_free("127.0.0.1", port)
        assert not free and "in use" in why.lower()
        # the same port on another loopback address, while this one still holds it: no other process can take
        # it in between, as it could once released
        free, why = doctor.port_free("127.0.0.2", port)
        assert free and why is None


def test_one_rank_reports_no_bandwidth(tmp_path, cli):
    """One process (one GPU, or --nproc 1): its all-reduce sends nothing, so no bandwidth is claimed for it.

    Seen on an H200 with one GPU: "all_reduce of 16 MiB: 0.0 ms, algbw 643.41 GB/s, busbw 0.00 GB/s".
    """
    proc = cli("doctor", "--nproc", "1", "--bandwidth-mb", "1", "--timeout", "60", "--json", str(tmp_path / "d.json"))
    out = proc.stdout
    assert "rendezvous of 1 processes (gloo" in out and "All checks passed." in out
    assert "algbw" not in out and "busbw" not in out
    assert "no all_reduce bandwidth with one process: nothing crosses a link (start 2 or more with --nproc)" in out
    assert "bandwidth" not in json.loads((tmp_path / "d.json").read_text())["rendezvous"][0]


def _two_ranks(backend: str, bandwidth: dict, shared_memory: dict | None = None) -> list[dict]:
    """What two healthy ranks send the doctor's report (``rank_checks``' shape)."""
    check = {"ok": True, "got": 3.0, "expected": 3.0}
    return [
        {
            "rank": r,
            "backend": backend,
            "device": f"cuda:{r}" if backend == "nccl" else "cpu",
            "rendezvous_s": 0.5,
            "checks": {"all_reduce": check, "all_gather": check, "broadcast": check},
            "bandwidth": bandwidth,
            "shared_memory": shared_memory,
        }
        for r in range(2)
    ]


def test_a_fast_all_reduce_keeps_its_digits(capsys):
    """A 1 MiB all-reduce over NVLink takes tens of microseconds: printed with one decimal it read "0.0 ms"."""
    from distrinews.cli.doctor.report import Report, report_results

    report_results(
        Report(), _two_ranks("nccl", {"bytes": 2**20, "time_ms": 0.0412, "algbw": 25.4e9, "busbw": 25.4e9}), world=2
    )
    assert "[ OK ] all_reduce of 1 MiB: 0.0412 ms, algbw 25.40 GB/s, busbw 25.40 GB/s" in capsys.readouterr().out


def test_too_small_a_dev_shm_names_the_sizes(capsys):
    """The gradients' size comes from the shared-memory check itself, not from the bandwidth figure."""
    from distrinews.cli.doctor.report import Report, report_results

    shm = {"used": False, "why": "/dev/shm has 1 MiB free", "bytes": 16 * 2**20, "needs_bytes": 48 * 2**20}
    bandwidth = {"bytes": 2**20, "time_ms": 2.5, "algbw": 0.4e9, "busbw": 0.4e9}
    report_results(Report(), _two_ranks("gloo", bandwidth, shm), world=2)
    out = capsys.readouterr().out
    assert "no shared-memory gradient average: /dev/shm has 1 MiB free; training averages through gloo instead" in out
    assert "16 MiB of gradients need 48 MiB of /dev/shm" in out

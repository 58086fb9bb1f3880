"""Two test hosts (conftest ``two_hosts``: network namespaces joined by a veth pair), one torchrun node each: a
real 2-node run. Each host has its own address, and rendezvous, gloo and the store all go over the veth link,
never loopback.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import QUIET, TINY

ROOT = Path(__file__).resolve().parents[2]
# Four steps of the tiny model; both ways of launching train exactly this.
TRAIN_ARGS = (
    *TINY,
    "--max_steps",
    "4",
    "--train_samples",
    "128",
    "--eval_samples",
    "64",
    *QUIET,
    "--bf16",
    "false",
)


def test_two_nodes_train_together(two_hosts, tmp_path, agnews_dir):
    (_, _, master_addr) = two_hosts[0]
    run = tmp_path / "run"
    procs = []
    for node_rank, (host, veth, addr) in enumerate(two_hosts):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": veth, "OMP_NUM_THREADS": "1"}
        cmd = [
            "ip",
            "netns",
            "exec",
            host,
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node-rank={node_rank}",
            "--nproc-per-node=1",
            "--rdzv-backend=static",
            f"--master-addr={master_addr}",
            "--master-port=29533",
            f"--local-addr={addr}",
            "-m",
            "distrinews",
            "train",
            *TRAIN_ARGS,
            "--output-dir",
            str(run),
        ]
        procs.append(
            subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            outs.append((p.returncode, out, err))
    finally:  # whatever ended the wait (a timeout, pytest-timeout): no node outlives the test
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
    for code, _out, err in outs:
        assert code == 0, err[-4000:]
    assert "World size:           2 (gloo, strategy ddp)" in outs[0][1]
    assert "of gradients (gloo)" in outs[0][1]  # ranks on two hosts: no shared-memory average
    assert "Effective batch size: 32" in outs[0][1]
    assert "TRAINING CONFIGURATION" not in outs[1][1], "only global rank 0 prints"
    state = json.loads((run / "checkpoints" / "step-4" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["global_step"] == 4
    assert (run / "best" / "model.safetensors").is_file()


def _our_command(
    host: str, veth: str, addr: str, node_rank: int, endpoint: str, run: Path, *extra: str
) -> subprocess.Popen:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": veth, "OMP_NUM_THREADS": "1"}
    # --local-addr: both test hosts share this machine's host name, so each is named by its own address.
    cmd = [
        "ip",
        "netns",
        "exec",
        host,
        sys.executable,
        "-m",
        "distrinews",
        "train",
        "--local-addr",
        addr,
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        "1",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "job-42",
        *TRAIN_ARGS,
        "--output-dir",
        str(run),
        *extra,
    ]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_nodes_through_our_command_hold_identical_parameters(two_hosts, tmp_path, agnews_dir):
    (_, _, addr_a), (_, _, _) = two_hosts
    endpoint = f"{addr_a}:29534"
    # Each node is given its own output directory: only global rank 0 may write anything.
    runs = [tmp_path / "node-0", tmp_path / "node-1"]
    procs = [_our_command(h, v, a, r, endpoint, runs[r]) for r, (h, v, a) in enumerate(two_hosts)]
    outs = []
    try:
        for p in procs:
            outs.append((p.returncode, *p.communicate(timeout=240)))
    finally:
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
    for p, (_, _out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
    printed = outs[0][1] + outs[1][1]
    assert printed.count("World size:           2 (gloo, strategy ddp)") == 1
    assert printed.count("Replicas: identical parameters on the 2 ranks") == 1
    written = [r for r in runs if r.exists()]
    assert len(written) == 1 and (written[0] / "checkpoints" / "step-4" / "manifest.json").is_file()
    assert (written[0] / "best" / "model.safetensors").is_file()


def test_a_node_that_never_joins_is_named(two_hosts, tmp_path, agnews_dir):
    (host_a, veth_a, addr_a) = two_hosts[0]
    endpoint = f"{addr_a}:29535"
    # 5 s of waiting for node 1: this node signs in to the roll call as soon as its own rendezvous store is up.
    proc = _our_command(host_a, veth_a, addr_a, 0, endpoint, tmp_path / "run", "--rdzv-conf", "join_timeout=5")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode != 0
    line = err.strip().splitlines()[-1]
    assert line == (
        f"distrinews: error: the rendezvous at {endpoint} timed out: node rank(s) 1 never joined "
        f"(joined: node 0 on {socket.gethostname()}); start them with the same command and --rdzv-endpoint {endpoint}, "
        f"and check that they can reach {endpoint}"
    ), err[-3000:]
    assert "Traceback" not in err

"""Two test hosts (network namespaces joined by a veth pair), one torchrun node each: a real 2-node run.

Needs root and iproute2 (as CI has); each host has its own address, and rendezvous, gloo and
the store all go over the veth link, never loopback.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


SUBNET = "10.231.{}.{}"


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")
    tag = uuid.uuid4().hex[:6]
    hosts = [f"dn-{tag}-a", f"dn-{tag}-b"]
    octet = int(tag[:2], 16)
    addrs = [SUBNET.format(octet, 1), SUBNET.format(octet, 2)]
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
        pytest.skip(f"cannot make test hosts here: {exc.stderr.strip()}")
    yield list(zip(hosts, veth, addrs))
    for h in hosts:
        subprocess.run(["ip", "netns", "del", h], capture_output=True)


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
            "--config",
            str(CONFIGS / "tiny.yaml"),
            "--max_steps",
            "4",
            "--train_samples",
            "128",
            "--eval_samples",
            "64",
            "--disable_tqdm",
            "true",
            "--report_to_tensorboard",
            "false",
            "--output-dir",
            str(run),
        ]
        procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append((p.returncode, out, err))
    for code, _out, err in outs:
        assert code == 0, err[-4000:]
    assert "World size:           2 (gloo, strategy ddp)" in outs[0][1]
    assert "Effective batch size: 32" in outs[0][1]
    assert "TRAINING CONFIGURATION" not in outs[1][1], "only global rank 0 prints"
    state = json.loads((run / "checkpoints" / "step-4" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["global_step"] == 4
    assert (run / "best" / "model.safetensors").is_file()

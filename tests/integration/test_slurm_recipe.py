"""The Slurm recipe (deploy/slurm/train.sbatch) run by bash with fake ``srun``, ``scontrol`` and ``hostname``
first on PATH: srun writes down its argv, so the test sees the exact ``distrinews train`` line each node
would run. No torch, no cluster, no network. The static checks of every recipe are in tests/unit/test_recipes.py.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from recipe_commands import SBATCH, option, readme_command, strip_layout


def test_sbatch_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SBATCH)], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


FAKE_SRUN = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DIR/srun.argv"
if [ -n "$FAKE_SRUN_HOLD" ]; then
    touch "$FAKE_DIR/srun.started"
    n=0
    while [ ! -e "$FAKE_DIR/srun.release" ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n + 1)); done
    exit 7
fi
exit 0
"""
FAKE_SCONTROL = """#!/bin/sh
if [ "$1" = requeue ]; then echo "$*" >> "$FAKE_DIR/scontrol.log"; exit 0; fi
[ "$1 $2 $3" = "show hostnames $SLURM_JOB_NODELIST" ] || { echo "unexpected: $*" >&2; exit 1; }
printf 'gpu-a17\\ngpu-a18\\n'
"""
FAKE_HOSTNAME = "#!/bin/sh\necho batch-host\n"
# The batch shell only checks that it is on PATH: running it there would be a bug.
FAKE_DISTRINEWS = "#!/bin/sh\necho 'distrinews ran in the batch shell' >&2\nexit 97\n"


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def slurm(tmp_path):
    """Run train.sbatch with fake Slurm tools; returns run(env=..., args=...) -> (proc, srun argv)."""
    fake = tmp_path / "fakebin"
    tools = tmp_path / "tools"
    fake.mkdir()
    tools.mkdir()
    _write_exe(fake / "srun", FAKE_SRUN)
    _write_exe(fake / "hostname", FAKE_HOSTNAME)
    _write_exe(fake / "distrinews", FAKE_DISTRINEWS)
    # Only the real tools the script and the fakes use: a real scontrol or srun on this
    # machine must not leak in.
    for tool in ("sed", "sleep", "touch"):
        (tools / tool).symlink_to(shutil.which(tool))
    bash = shutil.which("bash")

    def run(
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        scontrol: bool = True,
        hold: bool = False,
        distrinews: bool = True,
    ):
        (fake / "scontrol").unlink(missing_ok=True)
        if scontrol:
            _write_exe(fake / "scontrol", FAKE_SCONTROL)
        if not distrinews:
            (fake / "distrinews").unlink(missing_ok=True)
        full_env = {
            "PATH": f"{fake}:{tools}",
            "HOME": str(tmp_path),
            "FAKE_DIR": str(tmp_path),
            "SLURM_JOB_ID": "4242",
            "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "gpu-a[17-18]",
            "SLURM_CPUS_PER_TASK": "32",
        }
        if hold:
            full_env["FAKE_SRUN_HOLD"] = "1"
        full_env.update(env or {})
        full_env = {k: v for k, v in full_env.items() if v is not None}
        cmd = [bash, str(SBATCH), *args]
        if hold:
            return subprocess.Popen(
                cmd, env=full_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        proc = subprocess.run(cmd, check=False, env=full_env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        argv_file = tmp_path / "srun.argv"
        argv = argv_file.read_text().splitlines() if argv_file.exists() else None
        argv_file.unlink(missing_ok=True)
        return proc, argv

    return run


def split_srun(argv: list[str]) -> tuple[list[str], list[str]]:
    i = argv.index("distrinews")
    return argv[:i], argv[i:]


def test_sbatch_launches_the_expected_torchrun_line(slurm):
    proc, argv = slurm()
    assert proc.returncode == 0, proc.stderr
    srun_opts, command = split_srun(argv)
    assert srun_opts == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=32"]
    assert command == [
        "distrinews",
        "train",
        "--config",
        "configs/gpu-distilbert.yaml",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "8",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "gpu-a17:29642",  # first node from scontrol; port 29400 + 4242 % 1000
        "--rdzv-id",
        "4242",
        "--max-restarts",
        "3",
        "--data",
        "/shared/data/ag_news",
        "--output-dir",
        "/shared/runs/agnews",
        "--resume",
        "auto",
    ]


def test_sbatch_runs_the_readme_command(slurm):
    _, argv = slurm()
    assert strip_layout(split_srun(argv)[1]) == readme_command()


def test_sbatch_environment_overrides_and_extra_args(slurm):
    proc, argv = slurm(
        env={
            "CONFIG": "configs/cpu-quick.yaml",
            "DATA": "/lustre/ag",
            "RUN_DIR": "/lustre/runs/x",
            "PORT": "31000",
            "MAX_RESTARTS": "5",
            "GPUS_PER_NODE": "4",
            "SLURM_NNODES": "3",
            "SLURM_JOB_ID": "77",
            "SLURM_CPUS_PER_TASK": None,
        },
        args=("--learning_rate", "3e-5"),
    )
    assert proc.returncode == 0, proc.stderr
    srun_opts, command = split_srun(argv)
    assert srun_opts == ["--nodes=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert option(command, "--config") == "configs/cpu-quick.yaml"
    assert option(command, "--data") == "/lustre/ag"
    assert option(command, "--output-dir") == "/lustre/runs/x"
    assert option(command, "--nnodes") == "3"
    assert option(command, "--nproc-per-node") == "4"
    assert option(command, "--rdzv-endpoint") == "gpu-a17:31000"
    assert option(command, "--rdzv-id") == "77"
    assert option(command, "--max-restarts") == "5"
    assert command[-2:] == ["--learning_rate", "3e-5"]


def test_sbatch_takes_gpu_count_from_slurm(slurm):
    _, argv = slurm(env={"SLURM_GPUS_PER_NODE": "a100:4"})
    assert option(argv, "--nproc-per-node") == "4"
    _, argv = slurm(env={"SLURM_GPUS_PER_NODE": "2", "SLURM_JOB_ID": "1999"})
    assert option(argv, "--nproc-per-node") == "2"
    assert option(argv, "--rdzv-endpoint") == "gpu-a17:30399"


def test_sbatch_falls_back_to_hostname_without_scontrol(slurm):
    proc, argv = slurm(scontrol=False)
    assert proc.returncode == 0, proc.stderr
    assert option(argv, "--rdzv-endpoint") == "batch-host:29642"
    _, argv = slurm(env={"RDZV_HOST": "10.1.2.3"})
    assert option(argv, "--rdzv-endpoint") == "10.1.2.3:29642"


def test_sbatch_activates_venv_and_refuses_without_distrinews(slurm, tmp_path):
    proc, argv = slurm(distrinews=False)
    assert proc.returncode == 2 and argv is None, "srun must not start when distrinews is missing"
    assert "VENV" in proc.stderr

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'PATH="{venv}/bin:$PATH"\n')
    _write_exe(venv / "bin" / "distrinews", FAKE_DISTRINEWS)
    proc, argv = slurm(env={"VENV": str(venv)}, distrinews=False)
    assert proc.returncode == 0, proc.stderr
    assert split_srun(argv)[1][:2] == ["distrinews", "train"]


def test_sbatch_refuses_outside_a_job(slurm):
    proc, argv = slurm(env={"SLURM_JOB_ID": None})
    assert proc.returncode != 0 and argv is None
    assert "sbatch" in proc.stderr


def test_sbatch_requeues_on_usr1_and_waits_for_srun(slurm, tmp_path):
    job = slurm(hold=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "srun.started").exists():
            assert job.poll() is None and time.monotonic() < deadline, "srun never started"
            time.sleep(0.02)
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@180 sends the batch shell
        log = tmp_path / "scontrol.log"
        while not log.exists():
            assert job.poll() is None, "the script exited instead of requeueing"
            assert time.monotonic() < deadline, "scontrol requeue never ran"
            time.sleep(0.02)
        assert log.read_text().split() == ["requeue", "4242"]
        (tmp_path / "srun.release").touch()
        job.wait(timeout=60)
        # srun's status, which only a script that kept waiting for srun after the requeue can have: srun exits
        # only once released, after the requeue
        assert job.returncode == 7, "the script exits with srun's status"
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()

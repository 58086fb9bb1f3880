"""Cluster recipes (deploy/slurm, deploy/k8s): what can be checked without a cluster.

The manifests parse and carry the fields their APIs require (Kubeflow Trainer v2.2+ TrainJob,
Training Operator v1 PyTorchJob; field names from their Go types), and they run the command
that deploy/README.md gives. The sbatch script is run by bash with fake ``srun``, ``scontrol``
and ``hostname`` first on PATH: srun writes down its argv, so the test sees the exact
``distrinews train`` line each node would run. No torch, no cluster, no network.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
README = DEPLOY / "README.md"
SBATCH = DEPLOY / "slurm" / "train.sbatch"
K8S = DEPLOY / "k8s"

# Launcher flags that carry the cluster layout. The Kubeflow operators supply them as PET_*
# variables; only the Slurm script passes them on the command line.
LAYOUT_FLAGS = {
    "--nnodes",
    "--nproc-per-node",
    "--node-rank",
    "--rdzv-backend",
    "--rdzv-endpoint",
    "--rdzv-id",
    "--max-restarts",
}
# Set by the torch-distributed runtime; a TrainJob that sets one in env is rejected
# (kubeflow/trainer pkg/constants TorchRunReservedEnvNames).
TRAINER_RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
# Set by the v1 operator for a PyTorchJob with a Master (pkg/controller.v1/pytorch).
PYTORCHJOB_OPERATOR_ENV = TRAINER_RESERVED_ENV | {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}
# A DNS-1035 label: what both operators' webhooks require of metadata.name.
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
IMAGE = "ghcr.io/OWNER/distrinews-train:latest"


# ----------------------------------------------------------------------------- helpers
def strip_layout(argv: list[str]) -> list[str]:
    """argv without the layout flags and their values (``--flag value`` or ``--flag=value``)."""
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in LAYOUT_FLAGS:
            i += 1 if "=" in argv[i] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


def option(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def readme_section() -> str:
    text = README.read_text()
    start = text.index("\n## Cluster recipes\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def readme_command() -> list[str]:
    """The fenced block under "### The command every recipe runs", as argv."""
    section = readme_section()
    after = section[section.index("\n### The command every recipe runs\n") :]
    block = re.search(r"```(?:sh|bash)?\n(.*?)```", after, re.DOTALL)
    assert block, "no code block under 'The command every recipe runs'"
    return shlex.split(block.group(1).replace("\\\n", " "))


def load_docs(name: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    assert docs, f"{name} holds no document"
    return docs


def one_doc(name: str, kind: str) -> dict:
    docs = [d for d in load_docs(name) if d.get("kind") == kind]
    assert len(docs) == 1, f"{name}: expected one {kind}, found {len(docs)}"
    return docs[0]


def pvc() -> dict:
    return one_doc("storage.yaml", "PersistentVolumeClaim")


def trainjob() -> dict:
    return one_doc("trainjob.yaml", "TrainJob")


def pytorchjob() -> dict:
    return one_doc("pytorchjob.yaml", "PyTorchJob")


def trainjob_pod_patch(job: dict) -> dict:
    (patch,) = job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return rjob["template"]["spec"]["template"]["spec"]


def check_shared_volume(volumes: list[dict], mounts: list[dict], argv: list[str]) -> None:
    """The PVC of storage.yaml is mounted, and --data and --output-dir lie on it."""
    by_name = {v["name"]: v for v in volumes}
    assert len(by_name) == len(volumes), "duplicate volume names"
    for m in mounts:
        assert m["name"] in by_name, f"volumeMount {m['name']!r} has no volume"
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}
    assert list(claims.values()) == [pvc()["metadata"]["name"]], f"expected only the PVC of storage.yaml, got {claims}"
    (shared_mount,) = [m["mountPath"] for m in mounts if m["name"] in claims]
    for flag in ("--data", "--output-dir"):
        path = option(argv, flag)
        assert path.startswith(shared_mount.rstrip("/") + "/"), f"{flag} {path} is not on the shared volume ({shared_mount})"


def gpu_limit(resources: dict) -> int:
    return int(resources["limits"]["nvidia.com/gpu"])


# ----------------------------------------------------------------------------- README
def test_readme_gives_one_command_without_layout_flags():
    argv = readme_command()
    assert argv[:2] == ["distrinews", "train"]
    assert option(argv, "--resume") == "auto"
    assert option(argv, "--config") == "configs/gpu-distilbert.yaml"
    assert (ROOT / option(argv, "--config")).is_file()
    assert strip_layout(argv) == argv, "the layout flags belong to the launcher or PET_*, not the shared command"


def test_readme_names_every_recipe_and_the_image_placeholder():
    section = readme_section()
    for path in ("slurm/train.sbatch", "k8s/trainjob.yaml", "k8s/pytorchjob.yaml", "k8s/storage.yaml"):
        assert path in section
        assert (DEPLOY / path).is_file()
    assert IMAGE in section


def test_readme_table_maps_each_layout_flag_to_its_pet_variable():
    rows = {}
    for line in readme_section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"`--[a-z-]+`", cells[0]):
            rows[cells[0].strip("`")] = re.findall(r"`(PET_[A-Z_]+)`", cells[1])
    assert set(rows) == LAYOUT_FLAGS
    for flag, variables in rows.items():
        # torchrun's rule (torch.distributed.argparse_util.env): --foo-bar reads PET_FOO_BAR.
        assert variables[:1] == ["PET_" + flag[2:].upper().replace("-", "_")], (flag, variables)


# ----------------------------------------------------------------------------- manifests
@pytest.mark.parametrize("name", ["storage.yaml", "files-pod.yaml", "trainjob.yaml", "pytorchjob.yaml"])
def test_manifest_parses_with_type_and_name(name):
    for doc in load_docs(name):
        assert isinstance(doc.get("apiVersion"), str) and doc["apiVersion"]
        assert isinstance(doc.get("kind"), str) and doc["kind"]
        assert DNS1035.match(doc["metadata"]["name"]), doc["metadata"]["name"]


def test_storage_is_one_readwritemany_claim():
    claim = pvc()
    assert claim["apiVersion"] == "v1"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "pods on different nodes mount it at once"
    assert claim["spec"]["storageClassName"]
    assert claim["spec"]["resources"]["requests"]["storage"]
    # The job manifests must not carry it: deleting a job must never delete the checkpoints.
    for name in ("trainjob.yaml", "pytorchjob.yaml"):
        assert all(d["kind"] != "PersistentVolumeClaim" for d in load_docs(name)), name


def test_trainjob_fields():
    job = trainjob()
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    spec = job["spec"]
    # Field names of TrainJobSpec / Trainer in kubeflow/trainer pkg/apis/trainer/v1alpha1 (v2.3.0).
    assert set(spec) <= {"runtimeRef", "initializer", "trainer", "runtimePatches", "suspend", "activeDeadlineSeconds", "managedBy"}
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    trainer = spec["trainer"]
    assert set(trainer) <= {"image", "command", "args", "env", "numNodes", "resourcesPerNode", "numProcPerNode"}
    assert trainer["image"] == IMAGE
    assert isinstance(trainer["numNodes"], int) and trainer["numNodes"] >= 2
    # numProcPerNode is an int32 since Trainer v2.2; one process per GPU.
    assert isinstance(trainer["numProcPerNode"], int)
    assert trainer["numProcPerNode"] == gpu_limit(trainer["resourcesPerNode"])
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert not TRAINER_RESERVED_ENV & set(env), "the runtime rejects a TrainJob that sets its reserved PET_* names"
    assert int(env["PET_MAX_RESTARTS"]) >= 1
    assert "args" not in trainer, "the command is all in `command`"


def test_trainjob_runtime_patch_mounts_the_shared_volume():
    job = trainjob()
    (patch,) = job["spec"]["runtimePatches"]
    # The Trainer webhook requires a domain-prefixed manager ("acme.io/foo").
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9._~/-]+", patch["manager"]), patch["manager"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node", "the torch-distributed runtime's replicated job is `node`"
    pod = trainjob_pod_patch(job)
    # PodSpecPatch fields (v2.3.0): anything else is dropped or rejected.
    assert set(pod) <= {
        "serviceAccountName",
        "volumes",
        "initContainers",
        "containers",
        "imagePullSecrets",
        "securityContext",
        "nodeSelector",
        "affinity",
        "tolerations",
        "schedulingGates",
        "terminationGracePeriodSeconds",
    }
    (container,) = pod["containers"]
    assert container["name"] == "node", "the runtime's trainer container is `node`"
    assert set(container) <= {"name", "env", "volumeMounts", "securityContext"}
    assert "env" not in container, "env for the node container is rejected in runtimePatches"
    check_shared_volume(pod["volumes"], container["volumeMounts"], job["spec"]["trainer"]["command"])


def test_pytorchjob_fields():
    job = pytorchjob()
    assert job["apiVersion"] == "kubeflow.org/v1"
    spec = job["spec"]
    assert set(spec) <= {"runPolicy", "elasticPolicy", "pytorchReplicaSpecs", "nprocPerNode"}
    # Worker-only jobs are what elasticPolicy is for (PET_NNODES would leave the Master out).
    assert "elasticPolicy" not in spec
    replicas = spec["pytorchReplicaSpecs"]
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1, "the operator requires exactly one Master"
    assert replicas["Worker"]["replicas"] >= 1
    assert replicas["Master"]["template"] == replicas["Worker"]["template"], "Master and Worker must run the same pod"
    for role, rspec in replicas.items():
        assert rspec["restartPolicy"] == "OnFailure", role
        containers = rspec["template"]["spec"]["containers"]
        (container,) = [c for c in containers if c["name"] == "pytorch"]  # the operator's required name
        assert container["image"] == IMAGE
        env = {e["name"] for e in container.get("env", [])}
        assert not PYTORCHJOB_OPERATOR_ENV & env, f"{role}: the operator sets these itself"
        assert "PET_MAX_RESTARTS" in env
        # nprocPerNode is a *string in this API ("auto", "gpu", "8"); a bare 8 fails validation.
        assert isinstance(spec["nprocPerNode"], str)
        assert int(spec["nprocPerNode"]) == gpu_limit(container["resources"])
        check_shared_volume(rspec["template"]["spec"]["volumes"], container["volumeMounts"], container["command"])


def test_files_pod_mounts_the_same_volume():
    pod = one_doc("files-pod.yaml", "Pod")
    (container,) = pod["spec"]["containers"]
    (volume,) = pod["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc()["metadata"]["name"]
    (tj_mount,) = [m for m in trainjob_pod_patch(trainjob())["containers"][0]["volumeMounts"] if m["name"] == "shared"]
    assert container["volumeMounts"] == [{"name": volume["name"], "mountPath": tj_mount["mountPath"]}]


@pytest.mark.parametrize("recipe", ["trainjob", "pytorchjob-master", "pytorchjob-worker"])
def test_manifest_runs_the_readme_command(recipe):
    if recipe == "trainjob":
        argv = trainjob()["spec"]["trainer"]["command"]
    else:
        role = recipe.split("-")[1].capitalize()
        (container,) = pytorchjob()["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"]
        argv = container["command"]
    # PET_* from the operator carry the layout: a flag here would fight numNodes/nprocPerNode.
    assert strip_layout(argv) == argv, f"{recipe} hard-codes layout flags: {argv}"
    assert argv == readme_command()


# ----------------------------------------------------------------------------- Slurm
def sbatch_directives() -> dict[str, str]:
    out = {}
    for line in SBATCH.read_text().splitlines():
        m = re.match(r"#SBATCH\s+(--[\w-]+)(?:=(\S+))?", line)
        if m:
            out[m.group(1)] = m.group(2) or ""
    return out


def test_sbatch_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SBATCH)], check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_sbatch_header():
    d = sbatch_directives()
    assert d["--ntasks-per-node"] == "1", "one torchrun launcher per node"
    assert int(d["--nodes"]) >= 2
    assert int(d["--gpus-per-node"]) >= 1
    assert int(d["--cpus-per-task"]) >= 1
    assert d["--time"] and d["--output"]
    assert "--requeue" in d
    assert d["--open-mode"] == "append", "a requeued job must not truncate its log"
    sig = re.fullmatch(r"B:USR1@(\d+)", d["--signal"])
    assert sig and int(sig.group(1)) >= 60, d["--signal"]
    # Every directive precedes the first command, or sbatch ignores it.
    lines = SBATCH.read_text().splitlines()
    last_directive = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    assert all(not line.strip() or line.lstrip().startswith("#") for line in lines[1:last_directive])


FAKE_SRUN = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DIR/srun.argv"
if [ -n "$FAKE_SRUN_HOLD" ]; then
    touch "$FAKE_DIR/srun.started"
    n=0
    while [ ! -e "$FAKE_DIR/srun.release" ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
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
        env: dict[str, str] | None = None, args: tuple[str, ...] = (), scontrol: bool = True, hold: bool = False, distrinews: bool = True
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
            return subprocess.Popen(cmd, env=full_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
        deadline = time.monotonic() + 10
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
        time.sleep(0.2)
        assert job.poll() is None, "the script must keep waiting for srun after the requeue"
        (tmp_path / "srun.release").touch()
        job.wait(timeout=10)
        assert job.returncode == 7, "the script exits with srun's status"
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()

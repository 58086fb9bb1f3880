"""Cluster recipes (deploy/slurm, deploy/k8s): what can be checked without a cluster or a process.

The manifests parse and carry the fields their APIs require (Kubeflow Trainer v2.2+ TrainJob,
Training Operator v1 PyTorchJob; field names from their Go types), they run the command that
deploy/README.md gives, and the sbatch script's header asks Slurm for what the script relies on.
tests/integration/test_slurm_recipe.py runs the script itself.
"""

from __future__ import annotations

import re

import pytest
import yaml

from recipe_commands import DEPLOY, LAYOUT_FLAGS, ROOT, SBATCH, option, readme_command, readme_section, strip_layout

K8S = DEPLOY / "k8s"

# Set by the torch-distributed runtime; a TrainJob that sets one in env is rejected
# (kubeflow/trainer pkg/constants TorchRunReservedEnvNames).
TRAINER_RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
# Set by the v1 operator for a PyTorchJob with a Master (pkg/controller.v1/pytorch).
PYTORCHJOB_OPERATOR_ENV = TRAINER_RESERVED_ENV | {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}
# A DNS-1035 label: what both operators' webhooks require of metadata.name.
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
IMAGE = "ghcr.io/OWNER/distrinews-train:0.1.0"


# ----------------------------------------------------------------------------- helpers
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
        assert path.startswith(shared_mount.rstrip("/") + "/"), (
            f"{flag} {path} is not on the shared volume ({shared_mount})"
        )


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
    assert set(spec) <= {
        "runtimeRef",
        "initializer",
        "trainer",
        "runtimePatches",
        "suspend",
        "activeDeadlineSeconds",
        "managedBy",
    }
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
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

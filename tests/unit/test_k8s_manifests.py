"""Every manifest in deploy/k8s/ against the Kubernetes API schemas (kubernetes-validate, offline, strict: an
unknown or misspelt field fails), every pod they make hardened (not root, no capabilities, a read-only root, CPU
and memory limits, no service-account token, a versioned image), and the serving manifests against our server:
the probes' paths and the port exist in the app and its defaults, the probes need no API key, the command parses
as ``distrinews serve`` flags, and the Service, HPA and PDB point at the Deployment.

Custom resources (Kubeflow's TrainJob, PyTorchJob) have no schema in the validator: their pod templates are
validated as Pods.
"""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require

kubernetes_validate = require("kubernetes_validate", "needs kubernetes-validate (the dev extra)")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
SERVE_MANIFESTS = ("serve.yaml", "serve-model-in-image.yaml")


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _pod_specs(node: Any) -> list[dict[str, Any]]:
    """Every PodSpec (a mapping with ``containers``) inside a custom resource."""
    if isinstance(node, dict):
        if isinstance(node.get("containers"), list):
            return [node]
        return [spec for value in node.values() for spec in _pod_specs(value)]
    if isinstance(node, list):
        return [spec for value in node for spec in _pod_specs(value)]
    return []


@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(path):
    docs = _documents(path)
    assert docs, f"{path.name} holds no document"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:  # a custom resource: its pod templates, as Pods
            specs = _pod_specs(doc.get("spec", {}))
            assert specs, f"{path.name}: {doc['kind']} has no schema here and no pod template to check"
            for spec in specs:
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "template"}, "spec": spec}
                kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


def test_the_validator_refuses_a_misspelt_field():
    doc = _documents(K8S / "serve.yaml")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = doc["spec"]["template"]["spec"]["containers"][
        0
    ].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _pods(doc: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(pod spec, its containers as they run) for every pod ``doc`` makes. A TrainJob's trainer container is
    spread over ``spec.trainer`` (image, resources) and the runtime patch (security context, mounts)."""
    if doc["kind"] == "TrainJob":
        trainer = doc["spec"]["trainer"]
        (pod,) = _pod_specs(doc["spec"]["runtimePatches"])
        (patch,) = pod["containers"]
        return [(pod, [{**patch, "image": trainer["image"], "resources": trainer["resourcesPerNode"]}])]
    return [(spec, spec["containers"] + spec.get("initContainers", [])) for spec in _pod_specs(doc.get("spec", {}))]


# name[:tag][@sha256:digest], the registry's host:port left out of the tag
IMAGE_REF = re.compile(r"(?P<name>(?:[^/@]+/)*[^/:@]+)(?::(?P<tag>[\w][\w.-]*))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?")


def hardening_problems(doc: dict[str, Any]) -> list[str]:
    """What keeps a pod of ``doc`` from running as an unprivileged process that holds no cluster credentials."""
    problems = []
    for pod, containers in _pods(doc):
        where = f"{doc['kind']} {doc['metadata']['name']}"
        security = pod.get("securityContext", {})
        if security.get("runAsNonRoot") is not True or not security.get("runAsUser"):
            problems.append(f"{where}: the pod may run as root (runAsNonRoot true and a non-zero runAsUser)")
        if security.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: no RuntimeDefault seccomp profile")
        # A TrainJob's pods are the runtime's template, which the patch cannot change here (deploy/README.md).
        if doc["kind"] != "TrainJob" and pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: the service-account token is mounted (automountServiceAccountToken: false)")
        for container in containers:
            at = f"{where}, container {container['name']}"
            context = container.get("securityContext", {})
            if context.get("allowPrivilegeEscalation") is not False or context.get("privileged"):
                problems.append(f"{at}: may gain privileges (allowPrivilegeEscalation: false)")
            if context.get("capabilities", {}).get("drop") != ["ALL"] or context.get("capabilities", {}).get("add"):
                problems.append(f"{at}: keeps capabilities (drop: [ALL], add none)")
            if context.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{at}: writable root filesystem")
            limits = container.get("resources", {}).get("limits", {})
            if not {"cpu", "memory"} <= set(limits):
                problems.append(f"{at}: no {' or '.join(sorted({'cpu', 'memory'} - set(limits)))} limit")
            ref = IMAGE_REF.fullmatch(container.get("image", ""))
            if not ref or (ref["tag"] in (None, "latest") and not ref["digest"]):
                problems.append(f"{at}: image {container.get('image')!r} is not pinned (a version tag or a digest)")
    return problems


@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_every_pod_is_hardened(path):
    assert [problem for doc in _documents(path) for problem in hardening_problems(doc)] == []


def _serve_deployment() -> dict[str, Any]:
    return _by_kind(K8S / "serve.yaml")["Deployment"]


def _unset(path: list, doc_of=_serve_deployment):
    """A serve.yaml Deployment with the field at ``path`` (below the first container or the pod) removed."""

    def broken() -> dict[str, Any]:
        doc = copy.deepcopy(doc_of())
        node = doc["spec"]["template"]["spec"]
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1])
        return doc

    return broken


def _set_image(image: str):
    def broken() -> dict[str, Any]:
        doc = copy.deepcopy(_serve_deployment())
        doc["spec"]["template"]["spec"]["containers"][0]["image"] = image
        return doc

    return broken


def _files_pod_as_root() -> dict[str, Any]:
    doc = copy.deepcopy(_documents(K8S / "files-pod.yaml")[0])
    doc["spec"]["securityContext"]["runAsUser"] = 0
    return doc


def _trainjob_without_cpu_limit() -> dict[str, Any]:
    doc = copy.deepcopy(_documents(K8S / "trainjob.yaml")[0])
    doc["spec"]["trainer"]["resourcesPerNode"]["limits"].pop("cpu")
    return doc


@pytest.mark.parametrize(
    "broken,problem",
    [
        (_unset(["automountServiceAccountToken"]), "the service-account token is mounted"),
        (_unset(["securityContext", "runAsNonRoot"]), "the pod may run as root"),
        (_files_pod_as_root, "the pod may run as root"),
        (_unset(["containers", 0, "securityContext", "capabilities"]), "keeps capabilities"),
        (_unset(["containers", 0, "securityContext", "readOnlyRootFilesystem"]), "writable root filesystem"),
        (_unset(["containers", 0, "securityContext", "allowPrivilegeEscalation"]), "may gain privileges"),
        (_unset(["containers", 0, "resources", "limits", "cpu"]), "no cpu limit"),
        (_trainjob_without_cpu_limit, "no cpu limit"),
        (_set_image("ghcr.io/OWNER/distrinews-serve:latest"), "is not pinned"),
        (_set_image("ghcr.io/OWNER/distrinews-serve"), "is not pinned"),
        (_set_image("localhost:5000/distrinews-serve"), "is not pinned"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_hardening_check_fails_when_its_setting_goes(broken, problem):
    assert any(problem in p for p in hardening_problems(broken())), hardening_problems(broken())


def test_a_pinned_image_passes():
    for image in (
        "ghcr.io/OWNER/distrinews-serve:0.1.0",
        "localhost:5000/distrinews-serve:1.2",
        f"busybox@sha256:{'0' * 64}",
    ):
        assert not [p for p in hardening_problems(_set_image(image)()) if "is not pinned" in p], image


def _by_kind(path: Path) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in _documents(path)}


@pytest.fixture(scope="module")
def routes(fake_predictor) -> set[str]:
    from distrinews.serve.app import ServeConfig, create_app

    app = create_app(ServeConfig(checkpoint="unused", api_key="k"), predictor_factory=fake_predictor)
    return {route.path for route in app.routes}


@pytest.mark.parametrize("name", SERVE_MANIFESTS)
def test_serving_manifest_matches_the_server(name, routes):
    from distrinews.serve.middleware import PUBLIC_PATHS
    from distrinews.serve.options import DEFAULT_PORT, ServeConfig, add_arguments

    docs = _by_kind(K8S / name)
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= set(docs)
    deployment = docs["Deployment"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == DEFAULT_PORT == int(env["PORT"]["value"])

    # The command is `distrinews serve` with flags it has; $(VAR) is what Kubernetes expands from env.
    command = container["command"]
    assert command[:2] == ["distrinews", "serve"]
    for ref in re.findall(r"\$\((\w+)\)", " ".join(command)):
        assert ref in env, f"{ref} is not in the container's env"
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args([re.sub(r"\$\(\w+\)", "2", a) for a in command[2:]])
    assert args.public_metrics, "Prometheus scrapes by annotation without the API key"
    assert env["SERVE_THREADS"]["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu"
    assert "cpu" in container["resources"]["limits"] and "cpu" in container["resources"]["requests"]
    assert env["DISTRINEWS_API_KEY"]["valueFrom"]["secretKeyRef"]["name"]

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes, f"{probe} asks {get['path']}, which the app does not serve"
        assert get["path"] in PUBLIC_PATHS, f"{probe} path {get['path']} needs the API key, which a probe does not send"
        assert ports.get(get["port"], get["port"]) == DEFAULT_PORT
    assert (
        container["readinessProbe"]["httpGet"]["path"] == "/ready"
        and container["livenessProbe"]["httpGet"]["path"] == "/health"
    )
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "the startup probe must cover model loading"

    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and int(notes["prometheus.io/port"]) == DEFAULT_PORT
    assert notes["prometheus.io/path"] in routes

    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = ServeConfig().timeout_graceful_shutdown
    assert pod["spec"]["terminationGracePeriodSeconds"] > int(pre_stop[1]) + drain, (
        "the grace period must let the drain finish"
    )

    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]], "a read-only root needs a writable /tmp"
    assert env["XDG_CACHE_HOME"]["value"].startswith("/tmp/")

    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] in ports
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["minAvailable"] < deployment["spec"]["replicas"] == 2
    target = docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert docs["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_the_two_serving_manifests_differ_only_in_where_the_model_comes_from():
    volume = _by_kind(K8S / "serve.yaml")["Deployment"]["spec"]["template"]["spec"]
    baked = _by_kind(K8S / "serve-model-in-image.yaml")["Deployment"]["spec"]["template"]["spec"]
    on_volume = {e["name"]: e.get("value") for e in volume["containers"][0]["env"]}["MODEL_CHECKPOINT"]
    in_image = {e["name"]: e.get("value") for e in baked["containers"][0]["env"]}["MODEL_CHECKPOINT"]
    mounted = {m["mountPath"] for m in volume["containers"][0]["volumeMounts"]}
    assert any(on_volume.startswith(m + "/") for m in mounted - {"/tmp"}), (
        "serve.yaml reads the model from a mounted volume"
    )
    assert in_image == "/models/best" and {m["mountPath"] for m in baked["containers"][0]["volumeMounts"]} == {"/tmp"}

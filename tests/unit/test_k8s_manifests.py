"""Every manifest in deploy/k8s/ against the Kubernetes API schemas (kubernetes-validate, offline, strict: an
unknown or misspelt field fails), and the serving manifests against our server: the probes' paths and the
port exist in the app and its defaults, the probes need no API key, the command parses as ``distrinews serve``
flags, and the Service, HPA and PDB point at the Deployment.

Custom resources (Kubeflow's TrainJob, PyTorchJob) have no schema in the validator: their pod templates are
validated as Pods.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (the dev extra)")

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
    doc["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = doc["spec"]["template"]["spec"]["containers"][0].pop(
        "readinessProbe"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


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
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready" and container["livenessProbe"]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "the startup probe must cover model loading"

    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and int(notes["prometheus.io/port"]) == DEFAULT_PORT
    assert notes["prometheus.io/path"] in routes

    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = ServeConfig().timeout_graceful_shutdown
    assert pod["spec"]["terminationGracePeriodSeconds"] > int(pre_stop[1]) + drain, "the grace period must let the drain finish"

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
    assert any(on_volume.startswith(m + "/") for m in mounted - {"/tmp"}), "serve.yaml reads the model from a mounted volume"
    assert in_image == "/models/best" and {m["mountPath"] for m in baked["containers"][0]["volumeMounts"]} == {"/tmp"}

"""Kubernetes manifests: every overlay builds, validates strictly, and says what the programs read.

`kubectl kustomize` builds each overlay (no cluster needed); `kubernetes-validate
--strict` checks every built resource offline against Kubernetes KUBE_VERSION's own
schemas. It has no schema for the Prometheus Operator's CRDs (ServiceMonitor,
PrometheusRule) and only warns about them; those are checked here against a schema
of the fields we use (unknown fields refused), and the rules against promtool.
"""

from __future__ import annotations

import posixpath
import subprocess
import tomllib
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agent.config import AgentSettings
from agent.railmap import parse_rail_map
from scheduler_svc.config import Settings
from scheduler_svc.fleet.actions import NodeClear, NodeFlag
from scheduler_svc.fleet.kubernetes import KubernetesActions
from tests.deploy.tools import need_tool
from tests.fleet.conftest import K8sStandIn

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
KUBE_VERSION = "1.37.0"
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
WORKLOADS = {"Deployment", "DaemonSet", "Job"}
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
Doc = dict[str, Any]


@cache
def build(overlay: str) -> tuple[str, list[Doc]]:
    kubectl = need_tool("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def env_of(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def test_both_overlays_exist() -> None:
    assert OVERLAYS == ["postgres-multi", "sqlite-single"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strictly(overlay: str, tmp_path: Path) -> None:
    text, docs = build(overlay)
    built = tmp_path / f"{overlay}.yaml"
    built.write_text(text)
    validator = need_tool("kubernetes-validate")
    r = subprocess.run(
        [validator, "--strict", "-k", KUBE_VERSION, str(built)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = (r.stdout + r.stderr).splitlines()
    assert r.returncode == 0, "\n".join(lines)
    problems = [ln for ln in lines if not ln.startswith(("INFO", "WARN"))]
    assert not problems, "\n".join(problems)
    # The only resources without a schema must be the CRDs checked below.
    unschemaed = [ln for ln in lines if ln.startswith("WARN") and "find schema" in ln]
    crds = [d for d in docs if d["kind"] in CRD_KINDS]
    assert len(unschemaed) == len(crds) == 3, "\n".join(unschemaed)
    assert all(any(k in ln for k in CRD_KINDS) for ln in unschemaed)
    kinds = {d["kind"] for d in docs}
    assert {
        "Namespace",
        "DaemonSet",
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
        "Job",
    } <= kinds


def test_strict_validation_refuses_an_unknown_field() -> None:
    """Guards the guard: a misspelt field must fail, or the test above proves nothing."""
    import kubernetes_validate

    _, docs = build("sqlite-single")
    ds = one(docs, "DaemonSet", "railover-agent")
    ds["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, KUBE_VERSION, strict=True)


# A schema of the Prometheus Operator fields these manifests use; anything else is refused.
_STR = {"type": "string"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": _STR, "namespace": _STR, "labels": _LABELS},
    "additionalProperties": False,
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {"matchLabels": _LABELS},
                    "additionalProperties": False,
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": _STR,
                            "path": _STR,
                            "interval": {"type": "string", "pattern": r"^[0-9]+(ms|s|m|h)$"},
                            "relabelings": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "sourceLabels": {"type": "array", "items": _STR},
                                        "targetLabel": _STR,
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1}},
        },
    },
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_operator_resources(overlay: str, tmp_path: Path) -> None:
    _, docs = build(overlay)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"railover", "railover-agent"}
    for m in monitors:
        jsonschema.validate(m, SERVICE_MONITOR)
        # It must select the Service of its own name (the job label the rules expect),
        # through a port that Service has.
        svc = services[m["metadata"]["name"]]
        labels = svc["metadata"]["labels"]
        assert m["spec"]["selector"]["matchLabels"].items() <= labels.items()
        others = [s for n, s in services.items() if n != m["metadata"]["name"]]
        for other in others:
            assert (
                not m["spec"]["selector"]["matchLabels"].items()
                <= other["metadata"]["labels"].items()
            ), f"ServiceMonitor {m['metadata']['name']} also selects another Service"
        ports = {p["name"] for p in svc["spec"]["ports"]}
        assert {e["port"] for e in m["spec"]["endpoints"]} <= ports

    rule = one(docs, "PrometheusRule", "railover")
    jsonschema.validate(rule, PROMETHEUS_RULE)
    rules_file = yaml.safe_load(
        (ROOT / "deploy" / "prometheus" / "railover-alerts.yaml").read_text()
    )
    assert rule["spec"] == rules_file, "PrometheusRule drifted from deploy/prometheus"
    extracted = tmp_path / "rules.yaml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    r = subprocess.run(
        [need_tool("promtool"), "check", "rules", str(extracted)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def agent_env_names() -> set[str]:
    return {f"RAILOVER_AGENT_{n.upper()}" for n in AgentSettings.model_fields}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_agent_daemonset(overlay: str) -> None:
    _, docs = build(overlay)
    ds = one(docs, "DaemonSet", "railover-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["automountServiceAccountToken"] is False
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    (agent,) = pod["containers"]
    env = env_of(agent)
    values: dict[str, str] = {k: e.get("value", "") for k, e in env.items()}

    # Every RAILOVER_AGENT_* variable set is one the agent reads (a typo would be ignored).
    ours = {k for k in env if k.startswith("RAILOVER_AGENT_")}
    assert ours <= agent_env_names(), ours - agent_env_names()
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert values["RAILOVER_AGENT_NODE_NAME"] == "$(NODE_NAME)"
    # Plain http to a non-loopback host is refused unless explicitly allowed.
    assert values["RAILOVER_AGENT_SERVICE_URL"] == "http://railover.railover.svc:8080"
    assert values["RAILOVER_AGENT_ALLOW_INSECURE_HTTP"] == "true"
    assert "RAILOVER_AGENT_TOKEN" in agent["args"][0]  # read from the node's Secret key
    assert "exec railover-agent" in agent["args"][0]

    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    sys_mount = mounts["sys"]
    assert sys_mount["mountPath"] == "/host/sys" and sys_mount["readOnly"] is True
    assert volumes["sys"]["hostPath"]["path"] == "/sys"
    assert values["RAILOVER_AGENT_SYSFS_ROOT"] == "/host/sys"
    socket_dir = posixpath.dirname(values["RAILOVER_AGENT_SOCKET"])
    assert mounts["socket-dir"]["mountPath"] == socket_dir
    assert volumes["socket-dir"]["hostPath"]["path"] == socket_dir
    assert mounts["spool"]["mountPath"] == values["RAILOVER_AGENT_SPOOL_DIR"]
    assert "hostPath" in volumes["spool"]
    rail_map = values["RAILOVER_AGENT_RAIL_MAP"]
    assert posixpath.dirname(rail_map) == mounts["rail-map"]["mountPath"]
    cm = one(docs, "ConfigMap", volumes["rail-map"]["configMap"]["name"])
    parsed = parse_rail_map(yaml.safe_load(cm["data"][posixpath.basename(rail_map)]))
    assert {a.rail for a in parsed.values()} == set(range(8))

    port = int(values["RAILOVER_AGENT_METRICS_PORT"])
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert ports["metrics"] == port
    for probe in ("livenessProbe", "readinessProbe"):
        get = agent[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["port"] == "metrics", probe

    for c in pod["containers"] + pod["initContainers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert {"cpu", "memory"} <= c["resources"]["requests"].keys(), c["name"]
        assert {"cpu", "memory"} <= c["resources"]["limits"].keys(), c["name"]
    assert "runAsUser" not in agent["securityContext"]  # the pod's non-root user
    # Only the init step that hands the host directories to that user runs as root,
    # with CAP_CHOWN alone.
    (init,) = pod["initContainers"]
    assert init["securityContext"]["capabilities"]["add"] == ["CHOWN"]
    assert {m["name"] for m in init["volumeMounts"]} == {"socket-dir", "spool"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_deployment(overlay: str) -> None:
    _, docs = build(overlay)
    dep = one(docs, "Deployment", "railover")
    pod = dep["spec"]["template"]["spec"]
    (svc_container,) = pod["containers"]
    assert svc_container["command"] + svc_container["args"] == [
        "railover",
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    ]
    assert svc_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert svc_container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    for c in pod["containers"] + pod["initContainers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "limits" in c["resources"]

    service = one(docs, "Service", "railover")
    assert service["spec"]["selector"].items() <= pod_labels(dep).items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"

    # Every RAILOVER_* variable given to the service is one `railover serve` reads.
    config = one(docs, "ConfigMap", "railover-service")["data"]
    names = set(config) | {k for c in pod["containers"] for k in env_of(c)}
    known = {f"RAILOVER_{n.upper()}" for n in Settings.model_fields}
    assert names <= known, names - known

    db = config.get("RAILOVER_DB_URL") or env_of(svc_container)["RAILOVER_DB_URL"]
    pdb = one(docs, "PodDisruptionBudget", "railover")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(dep).items()
    if overlay == "sqlite-single":
        assert dep["spec"]["replicas"] == 1
        assert dep["spec"]["strategy"]["type"] == "Recreate"
        path = Settings(db_url=db).db_url.removeprefix("sqlite:///")
        mount = {m["name"]: m["mountPath"] for m in svc_container["volumeMounts"]}["data"]
        assert path.startswith(mount + "/")
        assert pdb["spec"]["maxUnavailable"] == 1  # a single replica must not block drains
    else:
        assert dep["spec"]["replicas"] >= 3
        assert db["valueFrom"]["secretKeyRef"]["name"] == "railover-db"
        one(docs, "Secret", "railover-db")
        assert pdb["spec"]["minAvailable"] == dep["spec"]["replicas"] - 1
        assert "maxUnavailable" not in pdb["spec"]


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def rbac_for(method: str, path: str) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) the API server authorises a core/v1 request as."""
    parts = path.split("?", maxsplit=1)[0].strip("/").split("/")
    assert parts[:2] == ["api", "v1"], path
    if parts[2] == "namespaces":
        resource, named = parts[4], len(parts) > 5
    else:
        resource, named = "/".join([parts[2], *parts[4:5]]), len(parts) > 3
    verb = {"GET": "get" if named else "list", "PATCH": "patch", "POST": "create"}[method]
    return ("", resource, verb)


def used_by_a_full_cycle(k8s: K8sStandIn) -> set[tuple[str, str, str]]:
    """Every request Railover's Kubernetes actions make: flag (each kind), then repair."""
    actions = KubernetesActions(Settings(k8s_enabled=True, k8s_api_url=k8s.url))
    restart = NodeFlag("n0", "decision d: restart", "mlx5_0", 1, "d", cordon=True)
    failover = NodeFlag("n1", "decision e: failover", "mlx5_0", 1, "e")
    for i, flag in enumerate((restart, failover)):
        actions.flag_node(flag, event_id=f"flag-{i}", now=NOW)
        actions.clear_node(NodeClear(flag.node, "repaired"), event_id=f"clear-{i}", now=NOW)
    assert k8s.refused() == []
    return {rbac_for(c.method, c.path) for c in k8s.calls}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_exactly_the_verbs_used(overlay: str, k8s: K8sStandIn) -> None:
    _, docs = build(overlay)
    roles = [d for d in docs if d["kind"] in {"ClusterRole", "Role"}]
    assert len(roles) == 1
    granted = {
        (group, resource, verb)
        for rule in roles[0]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == used_by_a_full_cycle(k8s)
    binding = one(docs, "ClusterRoleBinding", roles[0]["metadata"]["name"])
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "railover", "namespace": "railover"}
    ]
    dep = one(docs, "Deployment", "railover")
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "railover"


def image_name() -> str:
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "image-name"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_the_image_make_image_builds(overlay: str) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert image_name() == f"railover:{version}"
    _, docs = build(overlay)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in WORKLOADS]
    images = {c["image"] for pod in pods for c in pod["containers"] + pod.get("initContainers", [])}
    assert images == {image_name()}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_bootstrap_job_shares_the_services_store(overlay: str) -> None:
    _, docs = build(overlay)
    job = one(docs, "Job", "railover-bootstrap")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["railover", "token", "bootstrap"]
    assert pod["automountServiceAccountToken"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    service = one(docs, "Deployment", "railover")["spec"]["template"]["spec"]
    svc = service["containers"][0]
    assert c["envFrom"] == svc["envFrom"]
    assert env_of(c).get("RAILOVER_DB_URL") == env_of(svc).get("RAILOVER_DB_URL")
    (init,) = service["initContainers"]
    assert init["args"][0].startswith("railover db upgrade\n")
    if overlay == "sqlite-single":
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["data"] == {m["name"]: m["mountPath"] for m in svc["volumeMounts"]}["data"]
        claim = {v["name"]: v for v in pod["volumes"]}["data"]["persistentVolumeClaim"]
        assert claim["claimName"] == "railover-data"
        # ReadWriteOnce: only beside the service's pod.
        term = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["labelSelector"]["matchLabels"].items()
            <= pod_labels(one(docs, "Deployment", "railover")).items()
        )

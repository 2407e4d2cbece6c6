"""Kubernetes actions for a degraded node, through the official `kubernetes` client.

Flagging a node (fleet.actions says when), in this order (each step is
idempotent, so a retried delivery repeats it harmlessly):

1. PATCH /api/v1/nodes/{name}/status, strategic merge: a `RailoverRNICDegraded`
   condition. Node conditions merge by `type`, so the kubelet's own conditions
   are left alone and the kubelet keeps ours when it updates its own.
2. Per policy, PATCH /api/v1/nodes/{name}, strategic merge: the
   `railover.io/rnic-degraded` taint, and for a restart decision
   `spec.unschedulable: true` (cordon, what `kubectl cordon` sends) with the
   annotation `railover.io/cordoned`, so a repair uncordons only what Railover
   cordoned. `spec.taints` has no merge key, so a patch replaces the whole list:
   the node is read first and the patch carries `metadata.resourceVersion`, so a
   concurrent change makes it fail with 409 Conflict and the delivery is retried
   on fresh data rather than dropping someone else's taint.
3. POST /api/v1/namespaces/{ns}/events: a core/v1 Event about the Node whose
   message names the decision. core/v1 rather than events.k8s.io/v1: both store
   the same object, but the kubelet writes its node events through core/v1 in
   "default", `kubectl describe node` lists them by involvedObject, and the RBAC
   rule is the long-standing core one. The Event is named after the Railover
   event id, so a retry gets 409 AlreadyExists, taken as done.

Clearing a repaired node undoes 1 and 2 (the condition deleted by its merge key,
the taint list rewritten without ours under the same resourceVersion guard, the
cordon lifted if ours) and records a Normal Event.

RBAC, exactly these verbs (deploy/k8s/base/rbac.yaml; tests/deploy checks it
against every call the stand-in API server records):

    - apiGroups: [""]
      resources: ["nodes"]
      verbs: ["get", "patch"]
    - apiGroups: [""]
      resources: ["nodes/status"]
      verbs: ["patch"]
    - apiGroups: [""]
      resources: ["events"]
      verbs: ["create"]
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from scheduler_svc.config import Settings
from scheduler_svc.fleet.actions import NodeClear, NodeFlag
from scheduler_svc.fleet.webhooks import DeliveryFailed

CONDITION_TYPE = "RailoverRNICDegraded"
TAINT_KEY = "railover.io/rnic-degraded"
# On a node Railover cordoned (value: the decision id): a repair uncordons only these.
CORDON_ANNOTATION = "railover.io/cordoned"
COMPONENT = "railover-scheduler"


def api_client(settings: Settings) -> client.ApiClient:
    """A client for the configured API server, the in-cluster account, or ~/.kube/config."""
    cfg = client.Configuration()
    if settings.k8s_api_url:
        cfg.host = settings.k8s_api_url.rstrip("/")
        if settings.k8s_token_file:
            token = Path(settings.k8s_token_file).read_text().strip()
            cfg.api_key = {"authorization": f"Bearer {token}"}
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            config.load_kube_config(client_configuration=cfg)
    return client.ApiClient(cfg)


class KubernetesActions:
    def __init__(self, settings: Settings, api: client.ApiClient | None = None) -> None:
        self.settings = settings
        self.core = client.CoreV1Api(api or api_client(settings))

    def flag_node(self, flag: NodeFlag, *, event_id: str, now: datetime) -> None:
        try:
            self._condition(flag, now)
            self._taint_or_cordon(flag, now)
            self._event(flag.node, "RNICDegraded", flag.reason, "Warning", event_id, now)
        except ApiException as exc:
            raise DeliveryFailed(
                f"kubernetes {exc.status} {exc.reason}: node {flag.node}", exc.status
            ) from exc

    def clear_node(self, clear: NodeClear, *, event_id: str, now: datetime) -> None:
        try:
            # Deleting by merge key leaves the kubelet's conditions alone; absent, a no-op.
            body = {"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}}
            self.core.patch_node_status(clear.node, body)
            self._untaint_and_uncordon(clear.node)
            self._event(clear.node, "RNICRepaired", clear.reason, "Normal", event_id, now)
        except ApiException as exc:
            raise DeliveryFailed(
                f"kubernetes {exc.status} {exc.reason}: node {clear.node}", exc.status
            ) from exc

    def _condition(self, flag: NodeFlag, now: datetime) -> None:
        stamp = _time(now)
        body = {
            "status": {
                "conditions": [
                    {
                        "type": CONDITION_TYPE,
                        "status": "True",
                        "reason": "RNICDegraded",
                        "message": flag.reason,
                        "lastHeartbeatTime": stamp,
                        "lastTransitionTime": stamp,
                    }
                ]
            }
        }
        # A dict body makes the client send application/strategic-merge-patch+json.
        self.core.patch_node_status(flag.node, body)

    def _taint_or_cordon(self, flag: NodeFlag, now: datetime) -> None:
        policy = self.settings.k8s_node_policy
        spec: dict[str, Any] = {}
        patch: dict[str, Any] = {"spec": spec}
        node = self.core.read_node(flag.node)
        if policy in ("taint", "taint_and_cordon"):
            taints = [t.to_dict() for t in (node.spec.taints or [])]
            if not any(t["key"] == TAINT_KEY for t in taints):
                taint: dict[str, Any] = {
                    "key": TAINT_KEY,
                    "value": _label_value(flag.device or "true"),
                    "effect": self.settings.k8s_taint_effect,
                }
                if taint["effect"] == "NoExecute":
                    taint["timeAdded"] = _time(now)
                wire = [_taint_wire(t) for t in taints]
                spec["taints"] = [*wire, taint]
                patch["metadata"] = {"resourceVersion": node.metadata.resource_version}
        if flag.cordon and policy in ("cordon", "taint_and_cordon") and not node.spec.unschedulable:
            spec["unschedulable"] = True
            meta = patch.setdefault("metadata", {})
            meta["resourceVersion"] = node.metadata.resource_version
            meta["annotations"] = {CORDON_ANNOTATION: flag.decision_id or "true"}
        if spec:
            self.core.patch_node(flag.node, patch)

    def _untaint_and_uncordon(self, name: str) -> None:
        node = self.core.read_node(name)
        spec: dict[str, Any] = {}
        meta: dict[str, Any] = {"resourceVersion": node.metadata.resource_version}
        taints = [t.to_dict() for t in (node.spec.taints or [])]
        if any(t["key"] == TAINT_KEY for t in taints):
            spec["taints"] = [_taint_wire(t) for t in taints if t["key"] != TAINT_KEY]
        if CORDON_ANNOTATION in (node.metadata.annotations or {}):
            spec["unschedulable"] = False
            meta["annotations"] = {CORDON_ANNOTATION: None}  # null deletes a key
        if spec:
            self.core.patch_node(name, {"metadata": meta, "spec": spec})

    def _event(  # noqa: PLR0917  (private; every call reads as one sentence)
        self, node: str, reason: str, message: str, kind: str, event_id: str, now: datetime
    ) -> None:
        digest = hashlib.sha256(f"{event_id}/{node}".encode()).hexdigest()[:16]
        name = f"{node[:200]}.railover-{digest}"
        stamp = _time(now)
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self.settings.k8s_event_namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(self.settings.k8s_event_namespace, body)
        except ApiException as exc:
            if exc.status != 409:  # AlreadyExists: an earlier attempt created it
                raise


def _time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _taint_wire(t: dict[str, Any]) -> dict[str, Any]:
    """A taint read through the client, back in the API's camelCase field names."""
    out = {"key": t["key"], "effect": t["effect"]}
    if t.get("value") is not None:
        out["value"] = t["value"]
    if t.get("time_added") is not None:
        added = t["time_added"]
        out["timeAdded"] = _time(added) if isinstance(added, datetime) else str(added)
    return out


def _label_value(value: str) -> str:
    """Taint values follow label-value rules: 63 chars of [A-Za-z0-9._-]."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in value)[:63]
    return cleaned.strip("._-") or "true"

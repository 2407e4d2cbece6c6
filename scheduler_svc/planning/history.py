"""The fleet's own history as `railover export` writes it and `--history` reads it.

One JSON document (``History``), versioned by ``version``: the window it covers, the
inventory (each node's GPUs, RNICs, ports and switches, and when it was first
registered: what the exposure is counted from), every fault opened in the window with
its open, clear and close times, the switch failures the service inferred, the jobs
(sizes, checkpoint interval, reload, detection, declared and measured k) and the
decisions with what became of their commands. No secrets: no tokens, no webhook
subscriptions or secrets, no notification URLs, no decision inputs.

A new field is added with a default, so an older reader keeps reading; a change that
an older reader would misread bumps ``HISTORY_VERSION``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler_svc.engine.fabric import FaultKind
from scheduler_svc.planning.params import ParamError

HISTORY_VERSION: Literal[1] = 1

# The component a fault of each service kind broke, as the fit counts them.
COMPONENT: dict[str, str] = {
    FaultKind.LINK_DOWN: "link",
    FaultKind.RNIC_FATAL: "rnic",
    FaultKind.RNIC_LOST: "rnic",
    FaultKind.RETRY_EXCEEDED: "cqe",
    FaultKind.COUNTER_ERRORS: "degraded",
    FaultKind.PCIE_DEGRADED: "degraded",
    FaultKind.DEGRADED: "degraded",
    FaultKind.GPU_LOST: "gpu",
    FaultKind.UNREACHABLE: "node",
}


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Window(_Record):
    since: datetime = Field(description="Start of the window (inclusive)")
    until: datetime = Field(description="End of the window (exclusive): exposure ends here")


class ServiceRules(_Record):
    """The service's settings that shaped what was recorded."""

    failback_damping_s: float
    fault_quiet_s: float
    correlation_window_s: float
    policy: str


class NodeRecord(_Record):
    name: str
    registered_at: datetime = Field(description="First registration: exposure starts here")
    gpus: int
    rnics: int = Field(description="RNIC devices")
    ports: int = Field(description="RNIC ports: the links to the fabric")
    switches: list[str] = Field(description="The switches its ports are cabled to")


class FaultRecord(_Record):
    fault_id: int
    node: str
    device: str
    port: int = Field(description="0: the whole device")
    kind: str = Field(description="The service's fault kind (engine.fabric.FaultKind)")
    component: str = Field(description="link, rnic, cqe, degraded, gpu or node")
    opened_at: datetime
    cleared_at: datetime | None = Field(description="When the part was seen working again")
    resolved_at: datetime | None = Field(description="When it stopped being evidence")
    duration_s: float | None = Field(description="cleared_at - opened_at; null while open")
    switch: str | None
    switch_fault_id: int | None = Field(
        default=None, description="The inferred switch failure this port fault was part of"
    )


class SwitchFaultRecord(_Record):
    switch_fault_id: int
    switch: str
    opened_at: datetime
    cleared_at: datetime | None
    duration_s: float | None
    nodes: int = Field(description="Nodes whose port faults made the inference")


class JobRecord(_Record):
    job_id: str
    created_at: datetime
    ranks: int
    nodes: int
    checkpoint_interval_s: float
    checkpoint_kind: str = Field(description="The newest checkpoint's kind: full or flowcheck")
    reload_s: float
    detect_s: float
    timeout_s: float
    declared_k: float | None = Field(description="slowdown_k the fleet manager declared")
    measured_k: float | None = Field(description="k the service measured from iteration times")
    dp_size: int
    incarnation: int
    mode: str


class DecisionRecord(_Record):
    decision_id: str
    job_id: str
    created_at: datetime
    trigger: str
    fault_id: int | None
    action: str
    reason: str
    saved_gpu_s: float
    outcomes: dict[str, dict[str, int]] = Field(
        description="Command kind -> state (issued, applied, failed, ...) -> count"
    )


class History(_Record):
    version: Literal[1] = HISTORY_VERSION
    exported_at: datetime
    window: Window
    service: ServiceRules
    nodes: list[NodeRecord]
    faults: list[FaultRecord]
    switch_faults: list[SwitchFaultRecord]
    jobs: list[JobRecord]
    decisions: list[DecisionRecord]


def load_history(path: Path) -> History:
    """Read an export; every problem is a ParamError about --history."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ParamError("history", f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ParamError("history", f"{path} is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or "version" not in raw:
        raise ParamError("history", f"{path} is not a `railover export` (no version field)")
    if raw["version"] != HISTORY_VERSION:
        raise ParamError(
            "history",
            f"{path} is an export of version {raw['version']!r}; this program reads "
            f"version {HISTORY_VERSION}",
        )
    try:
        return History.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ParamError("history", f"{path}: {where}: {first['msg']}") from exc

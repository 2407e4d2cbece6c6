"""The engine's stories: one job on some nodes, driven through `reconcile` pass by pass.

A `Story` drives `reconcile` the way the service does: it keeps the desired state of the
previous pass, and the commands are `command_diff` between what was commanded and what is
desired now. test_reconcile.py and the other tests/engine decision tests tell theirs with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from railover_testing.cluster_shapes import hgx_node
from scheduler_svc.engine.fabric import (
    ClearingRules,
    Evidence,
    FaultEvidence,
    FaultKind,
    Maintenance,
    Quarantine,
    SwitchEvidence,
    assess,
)
from scheduler_svc.engine.intents import Intent, command_diff
from scheduler_svc.engine.paths import Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.reconcile import reconcile
from scheduler_svc.engine.state import (
    Action,
    CheckpointSeen,
    CommSpec,
    DecisionRecord,
    Desired,
    FabricView,
    JobState,
    Mode,
    Options,
    Reconciled,
)

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
RULES = ClearingRules(damping_s=120, quiet_s=300)


def topo(name: str, gpus: int = 8, **shape: Any) -> NodeTopology:
    """An HGX node (hgx_node's `shape` arguments), keeping only its first `gpus` GPUs."""
    body: dict[str, Any] = hgx_node(**shape)
    return NodeTopology(
        name,
        tuple(Gpu(**g) for g in body["gpus"] if g["index"] < gpus),
        tuple(
            Rnic(**{k: v for k, v in r.items() if k not in ("link_layer", "netdev")})
            for r in body["rnics"]
        ),
    )


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def down(fid: int, node: str, device: str, s: float, **kw: Any) -> FaultEvidence:
    return FaultEvidence(fid, node, device, 1, FaultKind.LINK_DOWN, at(s), **kw)


@dataclass
class Story:
    """One job on some nodes, and the evidence as it comes and goes."""

    nodes: list[str]
    comm_channels: int | None = 16
    job_kw: dict[str, Any] = field(default_factory=dict)
    # (rank, node, GPU) of every rank; None: 8 per node, numbered node by node.
    ranks: tuple[tuple[int, str, int], ...] | None = None
    # hgx_node arguments of every node (rails, switches, switch_name).
    shape: dict[str, Any] = field(default_factory=dict)
    options: Options = field(default_factory=Options)
    faults: dict[int, FaultEvidence] = field(default_factory=dict)
    switches: dict[int, SwitchEvidence] = field(default_factory=dict)
    quarantines: dict[int, Quarantine] = field(default_factory=dict)
    windows: dict[int, Maintenance] = field(default_factory=dict)
    lost_gpus: dict[str, int] = field(default_factory=dict)
    desired: Desired = field(default_factory=Desired)
    commanded: Desired = field(default_factory=Desired)
    mode: Mode = Mode.NORMAL
    failed_over_at: datetime | None = None
    restart_decided_at: datetime | None = None
    checkpoint: CheckpointSeen | None = None
    last_checkpoint_at: datetime = T0
    measured_k: float | None = None
    decisions: list[Reconciled] = field(default_factory=list)
    intents: list[list[Intent]] = field(default_factory=list)

    def job(self) -> JobState:
        ranks = self.ranks or tuple(
            (i * 8 + g, n, g) for i, n in enumerate(self.nodes) for g in range(8)
        )
        comms = () if self.comm_channels is None else (CommSpec(77, self.comm_channels),)
        comms = self.job_kw.get("communicators", comms)
        kw: dict[str, Any] = {
            "checkpoint_interval_s": 3600,
            "reload_s": 600,
            "detect_s": 0,
            "timeout_s": 30,
            "slowdown_k": 1.5,
        } | {k: v for k, v in self.job_kw.items() if k != "communicators"}
        return JobState(
            job_id="j",
            mode=self.mode,
            ranks=ranks,
            last_checkpoint_at=self.last_checkpoint_at,
            communicators=comms,
            measured_k=self.measured_k,
            failed_over_at=self.failed_over_at,
            restart_decided_at=self.restart_decided_at,
            newest_checkpoint=self.checkpoint,
            previous=self.desired,
            **kw,
        )

    def fabric(self, now: datetime) -> FabricView:
        health = assess(
            Evidence(
                faults=tuple(self.faults.values()),
                switches=tuple(self.switches.values()),
                quarantines=tuple(self.quarantines.values()),
                maintenance=tuple(self.windows.values()),
            ),
            now,
            RULES,
        )
        topologies = {n: topo(n, self.lost_gpus.get(n, 8), **self.shape) for n in self.nodes}
        # A lost GPU stays in the plan (the service keeps it as a ghost) and fails.
        full = {n: topo(n, **self.shape) for n in self.nodes}
        return FabricView(
            topologies=full,
            plans={n: plan_node(t) for n, t in full.items()},
            failed=replace(
                health.failed,
                gpus=health.failed.gpus
                | {(n, g) for n, k in self.lost_gpus.items() for g in range(k, 8)},
            ),
            unhealthy=health.unhealthy,
            fabric_ports={
                n: frozenset((r.name, r.port) for r in t.rnics) for n, t in topologies.items()
            },
            scheduled=health.scheduled,
        )

    def step(self, s: float) -> Reconciled:
        """One pass at T0 + s, applied as the service applies it."""
        now = at(s)
        out = reconcile(now, self.job(), self.fabric(now), self.options)
        intents = command_diff(self.commanded, out.desired, self.job())
        self.intents.append(intents)
        if out.decision is not None:
            self.decisions.append(out)
        if out.desired.mode == Mode.FAILED_OVER and self.mode != Mode.FAILED_OVER:
            self.failed_over_at = now
        if out.desired.mode == Mode.RESTARTING and self.mode != Mode.RESTARTING:
            self.restart_decided_at = now
        self.mode = out.desired.mode
        self.desired = out.desired
        if intents:
            self.commanded = out.desired
        # Level-triggered: the same state again decides nothing and sends nothing.
        again = reconcile(now, self.job(), self.fabric(now), self.options)
        assert again.decision is None, again.decision
        assert again.desired == out.desired
        assert command_diff(self.commanded, again.desired, self.job()) == []
        return out


def mode(s: Story) -> Mode:
    return s.mode  # a call, so that mypy does not narrow it across steps


def kinds(intents: list[Intent]) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    return [(i.kind.value, i.ranks, i.disabled_channels) for i in intents]


SCALED = {"allow_scaling": True, "spare_nodes": False, "node_replace_s": 7200, "slowdown_k": 3.0}


def rails_3_and_6_fail(s: Story) -> None:
    """Rail 3 fails on n0 and n1, rail 6 on n0 (the one-rail waiting story of
    test_failback_decisions and the held-rank strength tests)."""
    s.faults[1] = down(1, "n0", "mlx5_3", 3000)
    s.faults[2] = down(2, "n1", "mlx5_3", 3000)
    s.faults[3] = down(3, "n0", "mlx5_6", 3000)
    s.step(3000)


def n0_returns_and_rank_3_waits(s: Story) -> DecisionRecord:
    """After rails_3_and_6_fail, n0's rails come back: rank 6 returns, rank 3 waits for
    rank 11 (still on n1's failed rail 3). The fail-back decision."""
    s.faults[1] = down(1, "n0", "mlx5_3", 3000, recovered_at=at(3100))
    s.faults[3] = down(3, "n0", "mlx5_6", 3000, recovered_at=at(3100))
    d = s.step(3220).decision
    assert d is not None and d.action == Action.FAILBACK
    assert [r["rank"] for r in d.plan["returning"]] == [6]
    assert d.plan["held"] == [3]
    assert dict(s.desired.moved) == {3: "mlx5_2/1", 11: "mlx5_2/1"}
    return d

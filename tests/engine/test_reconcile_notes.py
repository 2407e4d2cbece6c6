"""The words and plan records a decision carries: exact notes, moved ranks and plan."""

from __future__ import annotations

from datetime import UTC, datetime

from scheduler_svc.engine import decision as cost
from scheduler_svc.engine.evidence import fault_note, node_failure_note
from scheduler_svc.engine.fabric import Unhealthy
from scheduler_svc.engine.paths import FailedSet
from scheduler_svc.engine.records import cost_plan, moved_plan
from scheduler_svc.engine.routes import Connectivity, RankRoute
from scheduler_svc.engine.state import FabricView

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ev(kind: str, label: str = "n1/mlx5_0/1", reason: str = "why", **kw: object) -> Unhealthy:
    return Unhealthy("fault:1", label, kind, T0, reason, **kw)  # type: ignore[arg-type]


def test_note_for_each_kind() -> None:
    assert fault_note(None, []) is None
    assert fault_note(ev("switch", "s1", "all 4 links down"), []) == (
        "switch s1 inferred failed (all 4 links down); all its links count as failed"
    )
    assert fault_note(ev("gpu_lost", "n1/gpu3"), []) == (
        "GPU n1/gpu3 is gone from the node's registration (gpu_lost)"
    )
    assert fault_note(ev("rnic_lost", "n1/mlx5_2"), []) == (
        "RNIC n1/mlx5_2 is gone from the node's registration (rnic_lost)"
    )
    assert fault_note(ev("quarantine", reason="flapped 5 times"), []) == (
        "port n1/mlx5_0/1 is quarantined (flapped 5 times)"
    )
    assert fault_note(ev("unreachable", "n1", "3 commands unacknowledged"), []) == (
        "3 commands unacknowledged"
    )
    assert fault_note(ev("maintenance", "n1/mlx5_0", "planned maintenance 4 (fw)"), []) == (
        "n1/mlx5_0: planned maintenance 4 (fw)"
    )
    assert fault_note(ev("link_down"), []) is None


def route(rank: int, node: str, primary_ok: bool, backup_ok: bool) -> RankRoute:
    return RankRoute(
        rank, node, rank, f"mlx5_{rank}/1", f"mlx5_{rank + 4}/1", primary_ok, backup_ok
    )


CONN = Connectivity(
    (
        route(0, "n1", False, True),
        route(1, "n1", True, True),
        route(2, "n2", False, False),
        route(3, "n2", False, True),
    ),
    broken_pairs=3,
    total_pairs=6,
    isolated_ranks=(2,),
    failed_over_ranks=(0, 3),
    examples=((2, 0), (2, 1)),
)


def test_moved_plan_lists_only_ranks_on_their_backup() -> None:
    assert moved_plan(CONN) == [
        {"rank": 0, "node": "n1", "gpu": 0, "from": "mlx5_0/1", "to": "mlx5_4/1"},
        {"rank": 3, "node": "n2", "gpu": 3, "from": "mlx5_3/1", "to": "mlx5_7/1"},
    ]


def test_plan_record_is_exact() -> None:
    result = cost.decide(
        cost.DecisionInputs(
            checkpoint_interval_s=3600.0,
            elapsed_s=7200.0,
            detect_s=0.0,
            reload_s=600.0,
            timeout_s=30.0,
            k=1.5,
            k_source="measured",
            gpus=4,
        )
    )
    assert result.notes  # elapsed past the interval
    evidence = [
        ev("link_down", node="n1", device="mlx5_0", port=1),
        ev("rnic_fatal", "n2/mlx5_3", node="n2", device="mlx5_3", port=0),
        Unhealthy("switch:2", "s1", "switch", T0, "r", switch="s1"),
    ]
    got = cost_plan(CONN, 0.123456, "k from the job", result, evidence=evidence, warnings=("w1",))
    assert got == {
        "mitigation": "s-bond",
        "failed_over": moved_plan(CONN),
        "isolated_ranks": [2],
        "broken_pairs": 3,
        "example_broken_pairs": [[2, 0], [2, 1]],
        "bandwidth_left": 0.1235,
        "k_detail": "k from the job",
        "failed_components": [
            {
                "node": "n1",
                "device": "mlx5_0",
                "port": 1,
                "kind": "link_down",
                "component": "n1/mlx5_0/1",
                "evidence": "fault:1",
            },
            {
                "node": "n2",
                "device": "mlx5_3",
                "port": None,
                "kind": "rnic_fatal",
                "component": "n2/mlx5_3",
                "evidence": "fault:1",
            },
            {
                "node": None,
                "device": None,
                "port": None,
                "kind": "switch",
                "component": "s1",
                "evidence": "switch:2",
            },
        ],
        "warnings": ["w1"],
        "notes": list(result.notes),
    }
    assert type(got["isolated_ranks"]) is list
    assert cost_plan(CONN, None, "", result, evidence=[], warnings=())["bandwidth_left"] is None


PORTS = frozenset({("mlx5_0", 1), ("mlx5_1", 1)})
FABRIC = FabricView({}, {}, FailedSet(), fabric_ports={"n1": PORTS, "n2": PORTS, "n3": PORTS})


def test_node_failure_note_names_nodes_whose_every_fabric_port_failed() -> None:
    evidence = [
        ev("link_down", node="n2", device="mlx5_0", port=1),
        ev("link_down", node="n2", device="mlx5_1", port=1),
        ev("rnic_fatal", node="n1", device="mlx5_0", port=0),
        ev("rnic_fatal", node="n1", device="mlx5_1", port=0),
        ev("link_down", node="n3", device="mlx5_0", port=1),
        ev("switch", "s1", switch="s1"),
    ]
    assert node_failure_note(evidence, FABRIC, {"n1", "n2", "n3"}) == (
        "node failure: every fabric RNIC of n1, n2 failed (a dead peer, not the network)"
    )
    # Only the job's nodes count.
    assert node_failure_note(evidence, FABRIC, {"n2", "n3"}) == (
        "node failure: every fabric RNIC of n2 failed (a dead peer, not the network)"
    )
    assert node_failure_note(evidence, FABRIC, {"n3"}) is None
    # A node whose fabric ports are not known is never a dead node.
    unknown = FabricView({}, {}, FailedSet())
    assert node_failure_note(evidence, unknown, {"n1", "n2"}) is None
    # A piece without a device (a whole-node window) says nothing about ports.
    whole = [ev("maintenance", "n1", node="n1", port=0)]
    assert node_failure_note(whole, FABRIC, {"n1"}) is None
    # Another node's evidence does not complete this node's ports.
    mixed = [
        ev("link_down", node="n1", device="mlx5_0", port=1),
        ev("link_down", node="n2", device="mlx5_1", port=1),
    ]
    assert node_failure_note(mixed, FABRIC, {"n1", "n2"}) is None
    # A whole-device fault takes that device's ports only.
    card_and_link = [
        ev("rnic_fatal", node="n1", device="mlx5_0", port=0),
        ev("link_down", node="n1", device="mlx5_1", port=1),
    ]
    assert node_failure_note(card_and_link, FABRIC, {"n1"}) == (
        "node failure: every fabric RNIC of n1 failed (a dead peer, not the network)"
    )
    assert node_failure_note(card_and_link[:1], FABRIC, {"n1"}) is None

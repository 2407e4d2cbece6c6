"""Stock NCCL's failover domain at its edges: exact records, reasons and virtual NICs."""

from __future__ import annotations

from scheduler_svc.engine.nccl import (
    Device,
    NcclAssessment,
    NcclSpec,
    Outcome,
    RankDevice,
    VnicState,
    assess,
    assess_job,
    failback_note,
    virtual_nics,
)
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic
from scheduler_svc.engine.routes import RankRoute

PAIR = (frozenset({"mlx5_0", "mlx5_1"}),)
ON = NcclSpec((2, 29, 7), port_failover=True, merged_nics=PAIR)
RECOVERS = NcclSpec((2, 30, 1), port_failover=True, merged_nics=PAIR)
OFF = NcclSpec((2, 29, 7), port_failover=False, merged_nics=PAIR)
RAIL = NcclSpec((2, 30, 0), port_failover=True, merge="rail")


def node_topo(name: str) -> NodeTopology:
    """mlx5_0 (dual-port) and mlx5_1 on rails 0 and 1; mlx5_2 alone on rail 2."""
    rnics = (
        Rnic("mlx5_0", 1, switch="s0", rail=0, pcie_switch="p0"),
        Rnic("mlx5_0", 2, switch="s0", rail=0, pcie_switch="p0"),
        Rnic("mlx5_1", 1, switch="s1", rail=0, pcie_switch="p0"),
        Rnic("mlx5_2", 1, switch="s2", rail=2, pcie_switch="p1"),
    )
    return NodeTopology(name, (Gpu(0, "g0"), Gpu(1, "g1"), Gpu(2, "g2")), rnics)


TOPOS = {"a": node_topo("a"), "b": node_topo("b")}


def route(rank: int, node: str, primary: str | None) -> RankRoute:
    return RankRoute(rank, node, rank % 3, primary, None, True, False)


ROUTES = [
    route(0, "a", "mlx5_0/1"),
    route(1, "a", "mlx5_1/1"),
    route(2, "a", "mlx5_2/1"),
    route(3, "b", "mlx5_0/1"),
    route(4, "a", None),
]


def test_assess_job_one_port_of_a_dual_port_device_fails_it_over() -> None:
    got = assess_job(ON, TOPOS, FailedSet(links=frozenset({("a", "mlx5_0", 2)})), ROUTES)
    assert got.outcome == Outcome.FAILS_OVER
    assert got.vnics == (
        VnicState("a", ("mlx5_0", "mlx5_1"), ("mlx5_0",), Outcome.FAILS_OVER, (0, 1)),
    )
    assert got.degraded_ranks == (0, 1)
    assert got.fatal_ranks == ()
    assert got.bandwidth_left == 0.5
    assert got.reason == (
        "NCCL 2.29.7 with port failover: a virtual NIC [mlx5_0, mlx5_1] lost mlx5_0; NCCL "
        "fails over to its healthy partner itself (2 rank(s) run degraded)"
    )


def test_assess_job_first_port_lost_counts_the_device_lost() -> None:
    """A failed first port keeps the device lost when its healthy second port is seen."""
    got = assess_job(ON, TOPOS, FailedSet(links=frozenset({("b", "mlx5_0", 1)})), ROUTES)
    assert got.vnics == (
        VnicState("b", ("mlx5_0", "mlx5_1"), ("mlx5_0",), Outcome.FAILS_OVER, (3,)),
    )
    assert got.degraded_ranks == (3,)


def test_assess_job_a_lone_device_and_a_switch() -> None:
    failed = FailedSet(rnics=frozenset({("a", "mlx5_2")}), switches=frozenset({"s1"}))
    got = assess_job(ON, TOPOS, failed, ROUTES)
    assert got.outcome == Outcome.FATAL
    assert got.vnics == (
        VnicState("a", ("mlx5_0", "mlx5_1"), ("mlx5_1",), Outcome.FAILS_OVER, (0, 1)),
        VnicState("a", ("mlx5_2",), ("mlx5_2",), Outcome.FATAL, (2,)),
        VnicState("b", ("mlx5_0", "mlx5_1"), ("mlx5_1",), Outcome.FAILS_OVER, (3,)),
    )
    assert got.fatal_ranks == (2,)
    assert got.degraded_ranks == (0, 1, 3)
    assert got.bandwidth_left == 0.0
    assert got.reason == (
        "NCCL 2.29.7 with port failover: a virtual NIC [mlx5_2] lost mlx5_2; a virtual NIC "
        "of one device has no partner to fail over to: fatal inside NCCL, only a restart is left"
    )


def test_assess_job_nothing_failed_or_only_unrouted_nodes() -> None:
    got = assess_job(ON, TOPOS, FailedSet(), ROUTES)
    assert got == NcclAssessment(
        Outcome.UNTOUCHED,
        (),
        (),
        (),
        1.0,
        "NCCL 2.29.7 with port failover: no rank's virtual NIC lost a device",
    )
    other = assess_job(ON, TOPOS, FailedSet(links=frozenset({("c", "mlx5_0", 1)})), ROUTES)
    assert other.outcome == Outcome.UNTOUCHED
    # A rank on a broken node whose primary is unknown is not looked at.
    lone = assess_job(ON, TOPOS, FailedSet(rnics=frozenset({("a", "*")})), [route(4, "a", None)])
    assert lone.outcome == Outcome.UNTOUCHED


def test_assess_job_rail_merge_groups_by_rail() -> None:
    got = assess_job(RAIL, TOPOS, FailedSet(rnics=frozenset({("a", "mlx5_0")})), ROUTES)
    assert got.vnics == (
        VnicState("a", ("mlx5_0", "mlx5_1"), ("mlx5_0",), Outcome.FAILS_OVER, (0, 1)),
    )


def test_record_is_the_exact_plan_entry() -> None:
    a = NcclAssessment(
        Outcome.FATAL,
        (
            VnicState("a", ("mlx5_0", "mlx5_1"), ("mlx5_0",), Outcome.FAILS_OVER, (0, 1)),
            VnicState("b", ("mlx5_2",), ("mlx5_2",), Outcome.FATAL, (5,)),
        ),
        (0, 1),
        (5,),
        2 / 3,
        "why",
    )
    assert a.record() == {
        "outcome": "fatal",
        "degraded_ranks": [0, 1],
        "fatal_ranks": [5],
        "bandwidth_left": 0.6667,
        "virtual_nics": [
            {
                "node": "a",
                "members": ["mlx5_0", "mlx5_1"],
                "failed": ["mlx5_0"],
                "outcome": "fails_over",
            },
            {"node": "b", "members": ["mlx5_2"], "failed": ["mlx5_2"], "outcome": "fatal"},
        ],
    }
    assert type(a.record()["degraded_ranks"]) is list
    assert list(a.record()) == [
        "outcome",
        "degraded_ranks",
        "fatal_ranks",
        "bandwidth_left",
        "virtual_nics",
    ]


def devices(*failed: str) -> dict[str, list[Device]]:
    return {"a": [Device(f"mlx5_{i}", f"mlx5_{i}" not in failed) for i in range(3)]}


RANKS = [RankDevice(i, "a", f"mlx5_{i}") for i in range(3)]


def test_reason_port_failover_off() -> None:
    got = assess(OFF, devices("mlx5_1"), RANKS)
    assert got.reason == (
        "NCCL 2.29.7 without port failover: a virtual NIC [mlx5_0, mlx5_1] lost "
        "mlx5_1; port failover is not active, so a lost device aborts the communicator: "
        "fatal inside NCCL, only a restart is left"
    )


def test_reason_every_device_lost_names_the_fatal_one_not_the_first() -> None:
    spec = NcclSpec(
        (2, 30, 0),
        port_failover=True,
        merged_nics=(frozenset({"mlx5_0", "mlx5_1"}), frozenset({"mlx5_2", "mlx5_3"})),
    )
    nodes = {"a": [Device(f"mlx5_{i}", i == 1) for i in range(4)]}
    ranks = [RankDevice(i, "a", f"mlx5_{i}") for i in range(4)]
    assert assess(spec, nodes, ranks).reason == (
        "NCCL 2.30.0 with port failover: a virtual NIC [mlx5_2, mlx5_3] lost mlx5_2, mlx5_3; "
        "every device of the virtual NIC is lost: fatal inside NCCL, only a restart is left"
    )


def test_reason_port_failover_asked_of_an_old_nccl() -> None:
    old = NcclSpec((2, 28, 3), port_failover=True, merged_nics=PAIR)
    assert assess(old, devices("mlx5_0"), RANKS).reason == (
        "NCCL 2.28.3 (port failover needs 2.29.7): a virtual NIC [mlx5_0, mlx5_1] lost "
        "mlx5_0; port failover is not active, so a lost device aborts the communicator: "
        "fatal inside NCCL, only a restart is left"
    )


def test_reason_counts_degraded_ranks_over_every_vnic() -> None:
    spec = NcclSpec(
        (2, 29, 7),
        port_failover=True,
        merged_nics=(frozenset({"mlx5_0", "mlx5_1"}), frozenset({"mlx5_2", "mlx5_3"})),
    )
    nodes = {"a": [Device(f"mlx5_{i}", i not in (1, 3)) for i in range(4)]}
    ranks = [RankDevice(i, "a", f"mlx5_{i}") for i in range(4)]
    assert assess(spec, nodes, ranks).reason == (
        "NCCL 2.29.7 with port failover: a virtual NIC [mlx5_0, mlx5_1] lost mlx5_1; NCCL "
        "fails over to its healthy partner itself (4 rank(s) run degraded)"
    )


def test_failback_note_both_ways() -> None:
    assert failback_note(RECOVERS, "mlx5_0/1 of a") == (
        "NCCL 2.30.1 with port failover recovers mlx5_0/1 of a by itself (port recovery); "
        "recorded, no commands sent"
    )
    assert failback_note(ON, "mlx5_0/1 of a") == (
        "mlx5_0/1 of a is back, but NCCL 2.29.7 with port failover has no port recovery "
        "(2.30+): its ranks stay on the partner device until the job restarts"
    )


def test_virtual_nics_explicit_keeps_only_present_devices() -> None:
    spec = NcclSpec(
        (2, 29, 7),
        port_failover=True,
        merged_nics=(frozenset({"x", "y"}), frozenset({"z", "w"}), frozenset({"q"})),
    )
    devs = [Device("y", True), Device("z", True), Device("c", True), Device("b", True)]
    assert virtual_nics(spec, devs) == (
        frozenset({"y"}),
        frozenset({"z"}),
        frozenset({"b"}),
        frozenset({"c"}),
    )
    assert virtual_nics(spec, []) == ()


def test_virtual_nics_by_rail_and_by_pcie_switch() -> None:
    devs = [
        Device("d0", True, rail=10, pcie_switch="pB"),
        Device("d1", True, rail=2, pcie_switch="pA"),
        Device("d2", True, rail=10, pcie_switch="pA"),
        Device("d3", True, rail=None, pcie_switch=None),
        Device("d4", True, rail=2, pcie_switch=None),
    ]
    by_rail = NcclSpec((2, 29, 7), port_failover=True, merge="rail")
    # Groups sort by the key's text: "10" before "2".
    assert virtual_nics(by_rail, devs) == (
        frozenset({"d0", "d2"}),
        frozenset({"d1", "d4"}),
        frozenset({"d3"}),
    )
    by_switch = NcclSpec((2, 29, 7), port_failover=True, merge="pcie_switch")
    assert virtual_nics(by_switch, devs) == (
        frozenset({"d1", "d2"}),
        frozenset({"d0"}),
        frozenset({"d3"}),
        frozenset({"d4"}),
    )


def test_assess_job_pcie_switch_merge_uses_each_devices_switch() -> None:
    spec = NcclSpec((2, 29, 7), port_failover=True, merge="pcie_switch")
    got = assess_job(spec, TOPOS, FailedSet(rnics=frozenset({("a", "mlx5_1")})), ROUTES)
    # mlx5_0 and mlx5_1 share PCIe switch p0; mlx5_2 (p1) stands alone.
    assert got.vnics == (
        VnicState("a", ("mlx5_0", "mlx5_1"), ("mlx5_1",), Outcome.FAILS_OVER, (0, 1)),
    )


def test_assess_orders_virtual_nics_by_node_then_members_not_by_rank() -> None:
    pairs = (frozenset({"mlx5_0", "mlx5_1"}), frozenset({"mlx5_2", "mlx5_3"}))
    spec = NcclSpec((2, 29, 7), port_failover=True, merged_nics=pairs)
    broken = [Device(f"mlx5_{i}", i in (1, 2)) for i in range(4)]
    nodes = {
        "h": [Device(f"mlx5_{i}", True) for i in range(4)],  # healthy: not looked at
        "b": broken,
        "a": broken,
    }
    ranks = [
        RankDevice(0, "b", "mlx5_3"),
        RankDevice(1, "a", "mlx5_3"),
        RankDevice(2, "a", "mlx5_0"),
        RankDevice(3, "h", "mlx5_0"),
    ]
    got = assess(spec, nodes, ranks)
    assert got.vnics == (
        VnicState("a", ("mlx5_0", "mlx5_1"), ("mlx5_0",), Outcome.FAILS_OVER, (2,)),
        VnicState("a", ("mlx5_2", "mlx5_3"), ("mlx5_3",), Outcome.FAILS_OVER, (1,)),
        VnicState("b", ("mlx5_2", "mlx5_3"), ("mlx5_3",), Outcome.FAILS_OVER, (0,)),
    )
    # A healthy node listed first does not stop the others being looked at.
    first = assess(spec, {"h": nodes["h"], "a": broken}, [RankDevice(2, "a", "mlx5_0")])
    assert first.degraded_ranks == (2,)


def test_from_declaration_defaults_and_values() -> None:
    bare = NcclSpec.from_declaration({"version": "2.30"})
    assert bare == NcclSpec((2, 30, 0), port_failover=False, merge="explicit", merged_nics=())
    full = NcclSpec.from_declaration(
        {
            "version": "2.29.7",
            "port_failover": True,
            "merge": "rail",
            "merged_nics": [["mlx5_1", "mlx5_0"], ["mlx5_2"]],
        }
    )
    assert full == NcclSpec(
        (2, 29, 7),
        port_failover=True,
        merge="rail",
        merged_nics=(frozenset({"mlx5_0", "mlx5_1"}), frozenset({"mlx5_2"})),
    )

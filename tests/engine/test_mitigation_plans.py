"""plan_mitigations on a small hand-built fabric: what each communicator's plan rests on.

Each node has three GPUs and two single-port RNICs on rails 0 and 1. GPUs 0 and 2 sit
beside mlx5_0 (rail 0) and back up onto mlx5_1, which is on another root complex
(cost exactly 100); GPU 1 uses mlx5_1 and backs up onto mlx5_0. Every GPU has NVLink.
The expected plans are coord.plan_mitigation's for the inputs the fabric implies,
worked out by hand below.
"""

from __future__ import annotations

from typing import Any

from scheduler_svc.engine import coordination as coord
from scheduler_svc.engine import jobindex
from scheduler_svc.engine.mitigations import CommPlan, plan_mitigations, transit_gpus
from scheduler_svc.engine.mitigations import describe as engine_describe
from scheduler_svc.engine.mitigations import with_mitigations as engine_with_mitigations
from scheduler_svc.engine.nccl import NcclSpec
from scheduler_svc.engine.paths import FailedSet, Gpu, NodeTopology, Rnic, plan_node
from scheduler_svc.engine.routes import Connectivity, route_ranks
from scheduler_svc.engine.state import CommSpec, Desired, FabricView, Mode, Options
from tests.engine.jobs import a_job

OPTIONS = Options(nvl_mb_per_channel=30.0, nvl_cap_mb=300.0)


def node(name: str) -> NodeTopology:
    gpus = (
        Gpu(0, "g0", numa=0, pcie_switch="p0", root_complex="r0", nvlink=True),
        Gpu(1, "g1", numa=0, pcie_switch="p1", root_complex="r1", nvlink=True),
        Gpu(2, "g2", numa=0, pcie_switch="p0", root_complex="r0", nvlink=True),
    )
    rnics = (
        Rnic("mlx5_0", 1, numa=0, pcie_switch="p0", root_complex="r0", switch="s0", rail=0),
        Rnic("mlx5_1", 1, numa=0, pcie_switch="p0", root_complex="r1", switch="s1", rail=1),
    )
    return NodeTopology(name, gpus, rnics)


TOPOS = {"a": node("a"), "b": node("b")}
PLANS = {n: plan_node(t) for n, t in TOPOS.items()}
RANKS = tuple((i * 3 + g, n, g) for i, n in enumerate(("a", "b")) for g in range(3))


def plans_for(
    links: set[tuple[str, str, int]],
    comms: tuple[CommSpec, ...],
    *,
    nvl_cap_mb: float | None = None,
    comm_share: float | None = 0.45,
    ranks: tuple[tuple[int, str, int], ...] = RANKS,
    gpus: frozenset[tuple[str, int]] = frozenset(),
) -> list[CommPlan]:
    failed = FailedSet(links=frozenset(links), gpus=gpus)
    fabric = FabricView(TOPOS, PLANS, failed)
    routes = tuple(route_ranks(ranks, PLANS, TOPOS, failed))
    job = a_job(ranks, communicators=comms, comm_share=comm_share, nvl_cap_mb=nvl_cap_mb)
    return plan_mitigations(job, fabric, Connectivity(routes, 0, 0, (), (), ()), OPTIONS)


def test_the_fabric_is_as_described() -> None:
    got = [(g.gpu, g.primary, g.backup, g.backup_cost) for g in PLANS["a"].gpus]
    assert got == [(0, "mlx5_0/1", "mlx5_1/1", 100), (1, "mlx5_1/1", "mlx5_0/1", 101),
                   (2, "mlx5_0/1", "mlx5_1/1", 100)]  # fmt: skip


def test_balance_over_two_rails_after_skipping_empty_and_untouched_communicators() -> None:
    comms = (
        CommSpec(1, 4, ranks=(40,)),  # no rank the job has: skipped
        CommSpec(2, 4, ranks=(4, 5)),  # only node b, which lost nothing: skipped
        CommSpec(3, 4),
        CommSpec(4, 1),
    )
    got = plans_for({("a", "mlx5_0", 1)}, comms)
    # Node a uses rails 0 and 1, rail 0 failed; its three ranks all send through
    # mlx5_1 now; rank 0's backup crosses root complexes (cost 100).
    expected4 = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=2,
        failed_rails=1,
        channels=4,
        nodes=2,
        backup_load=3,
        backup_crosses_root_complex=True,
        nvl_available=False,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
        nvl_ranks_per_gpu=1,
    )
    assert expected4.chosen.mitigation == coord.Mitigation.BALANCE
    handoff = 0.5 / (1 + 0.5)
    assert expected4.chosen.detail["allreduce_handoff"] == handoff
    expected1 = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=2,
        failed_rails=1,
        channels=1,
        nodes=2,
        backup_load=3,
        backup_crosses_root_complex=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )
    assert expected1.chosen.mitigation == coord.Mitigation.BALANCE
    assert got == [
        # Channels 0 and 2 leave through rail 0; all four through mlx5_1 now.
        CommPlan(3, (0, 1, 2, 3, 4, 5), expected4, (0, 2), (0.25,) * 4, handoff, {}),
        # One channel, on the failed rail: disabling it would disable everything.
        CommPlan(4, (0, 1, 2, 3, 4, 5), expected1, (), (1.0,), handoff, {}),
    ]
    # The default comm_share is 0.3.
    default = plans_for({("a", "mlx5_0", 1)}, (CommSpec(3, 4),), comm_share=None)
    assert default[0].plan == coord.plan_mitigation(
        comm_share=0.3,
        rails_per_node=2,
        failed_rails=1,
        channels=4,
        nodes=2,
        backup_load=3,
        backup_crosses_root_complex=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )


def test_nvl_transit_for_a_one_rail_communicator() -> None:
    # Ranks 0 and 2 (rail 0 on a) and 3 and 5 (rail 0 on b): one rail per node.
    comms = (CommSpec(5, 4, ranks=(0, 2, 3, 5)),)
    got = plans_for({("a", "mlx5_0", 1)}, comms)
    # Both moved ranks send through GPU 1, whose primary is their backup: 2 per GPU.
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=1,
        failed_rails=1,
        channels=4,
        nodes=2,
        backup_load=2,
        backup_crosses_root_complex=True,
        nvl_available=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
        nvl_ranks_per_gpu=2,
    )
    assert expected.chosen.mitigation == coord.Mitigation.NVL
    assert expected.chosen.detail == {"gpu_memory_mb": 240.0}
    assert got == [CommPlan(5, (0, 2, 3, 5), expected, (), (), 0.0, {0: 1, 2: 1})]


def test_transit_gpus_names_each_moved_ranks_peer_and_the_most_on_one_gpu() -> None:
    """Each moved rank sends through the GPU whose primary is its backup; the count is the
    most ranks on one transit GPU, 0 when no rank moved (no GPU carries any)."""
    failed = FailedSet(links=frozenset({("a", "mlx5_0", 1)}))
    fabric = FabricView(TOPOS, PLANS, failed)
    moved = [r for r in route_ranks(RANKS, PLANS, TOPOS, failed) if not r.primary_ok]
    assert [r.rank for r in moved] == [0, 2]
    assert transit_gpus(moved, fabric) == ({0: 1, 2: 1}, 2)
    assert transit_gpus(moved[:1], fabric) == ({0: 1}, 1)
    assert transit_gpus([], fabric) == ({}, 0)


def test_the_jobs_own_nvl_cap_refuses_transit() -> None:
    comms = (CommSpec(5, 4, ranks=(0, 2, 3, 5)),)
    got = plans_for({("a", "mlx5_0", 1)}, comms, nvl_cap_mb=200.0)
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=1,
        failed_rails=1,
        channels=4,
        nodes=2,
        backup_load=2,
        backup_crosses_root_complex=True,
        nvl_available=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=200.0,
        nvl_ranks_per_gpu=2,
    )
    assert expected.chosen.mitigation == coord.Mitigation.SBOND
    nvl = next(o for o in expected.options if o.mitigation == coord.Mitigation.NVL)
    assert nvl.why == "needs 240 MB of GPU memory, over the 200 MB cap"
    assert got == [CommPlan(5, (0, 2, 3, 5), expected, (), (), 0.0, {})]


def test_no_moved_rank_means_no_nvl_and_a_backup_load_of_one() -> None:
    # Both of a's RNICs are down: ranks 0 and 2 have no path at all, nothing moved.
    comms = (CommSpec(6, 4, ranks=(0, 2, 4)),)
    got = plans_for({("a", "mlx5_0", 1), ("a", "mlx5_1", 1)}, comms)
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=1,
        failed_rails=1,
        channels=4,
        nodes=2,
        backup_load=1,
        backup_crosses_root_complex=False,
        nvl_available=False,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )
    assert got == [CommPlan(6, (0, 2, 4), expected, (), (), 0.0, {})]


def test_the_worst_node_is_the_one_with_most_failed_rails() -> None:
    # a lost both rails, b lost rail 0: a is the worst though b sorts last.
    links = {("a", "mlx5_0", 1), ("a", "mlx5_1", 1), ("b", "mlx5_0", 1)}
    got = plans_for(links, (CommSpec(7, 4),))
    # The job's index picks the same worst node.
    failed = FailedSet(links=frozenset(links))
    index = jobindex.build(RANKS, PLANS, TOPOS, (CommSpec(7, 4),))
    conn = jobindex.connectivity(index, failed, PLANS, TOPOS)
    job = a_job(RANKS, communicators=(CommSpec(7, 4),), comm_share=0.45)
    assert plan_mitigations(job, FabricView(TOPOS, PLANS, failed), conn, OPTIONS) == got
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=2,
        failed_rails=2,
        channels=4,
        nodes=2,
        backup_load=1,
        backup_crosses_root_complex=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )
    assert got == [CommPlan(7, (0, 1, 2, 3, 4, 5), expected, (), (), 0.0, {})]


def test_a_rank_without_a_path_adds_a_rail_of_its_own_sorted_last() -> None:
    ranks = (*RANKS, (6, "a", 9))  # GPU 9 of a is unknown: no primary, rail None
    got = plans_for({("a", "mlx5_0", 1)}, (CommSpec(8, 6),), ranks=ranks)
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=3,
        failed_rails=1,
        channels=6,
        nodes=2,
        backup_load=3,
        backup_crosses_root_complex=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )
    assert expected.chosen.mitigation == coord.Mitigation.BALANCE
    split = float(expected.chosen.detail["allreduce_handoff"])  # type: ignore[arg-type]
    # Rails [0, 1, None]: channels 0 and 3 on the failed rail 0, 2 and 5 nowhere.
    assert got == [
        CommPlan(
            8,
            (0, 1, 2, 3, 4, 5, 6),
            expected,
            (0, 3),
            (0.25, 0.25, 0.0, 0.25, 0.25, 0.0),
            split,
            {},
        )
    ]


def test_balance_weights_follow_the_worst_nodes_rnics() -> None:
    # Three channels over rails [0, 1]: on a every channel leaves through mlx5_1 now
    # (node b, untouched, would still send channels 0 and 2 through mlx5_0).
    got = plans_for({("a", "mlx5_0", 1)}, (CommSpec(9, 3),))
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=2,
        failed_rails=1,
        channels=3,
        nodes=2,
        backup_load=3,
        backup_crosses_root_complex=True,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )
    assert expected.chosen.mitigation == coord.Mitigation.BALANCE
    handoff = 0.5 / (1 + 0.5)
    assert got == [CommPlan(9, (0, 1, 2, 3, 4, 5), expected, (0, 2), (1 / 3,) * 3, handoff, {})]


def test_s_bond_chosen_over_two_rails_disables_no_channel() -> None:
    # GPU 0 of a is lost: rank 0 has no path, rank 1 alone uses mlx5_1 (load 1).
    got = plans_for(set(), (CommSpec(10, 4, ranks=(0, 1)),), gpus=frozenset({("a", 0)}))
    expected = coord.plan_mitigation(
        comm_share=0.45,
        rails_per_node=2,
        failed_rails=1,
        channels=4,
        nodes=1,
        backup_load=1,
        nvl_mb_per_channel=30.0,
        nvl_cap_mb=300.0,
    )
    assert expected.chosen.mitigation == coord.Mitigation.SBOND
    assert got == [CommPlan(10, (0, 1), expected, (), (), 0.0, {})]


def describe(comms: tuple[CommSpec, ...], links: set[tuple[str, str, int]]) -> dict[str, Any]:
    failed = FailedSet(links=frozenset(links))
    fabric = FabricView(TOPOS, PLANS, failed)
    routes = tuple(route_ranks(RANKS, PLANS, TOPOS, failed))
    job = a_job(RANKS, communicators=comms, comm_share=0.45)
    conn = Connectivity(routes, 0, 0, (), (), ())
    return engine_describe(Desired(), fabric, job, conn, OPTIONS)


def test_describe_records_each_plan_with_every_option() -> None:
    got = describe((CommSpec(5, 4, ranks=(0, 2, 3, 5)), CommSpec(3, 4)), {("a", "mlx5_0", 1)})
    nvl, balance = (
        p.plan
        for p in plans_for(
            {("a", "mlx5_0", 1)}, (CommSpec(5, 4, ranks=(0, 2, 3, 5)), CommSpec(3, 4))
        )
    )
    assert nvl.chosen.mitigation == coord.Mitigation.NVL
    assert balance.chosen.mitigation == coord.Mitigation.BALANCE
    sbond, dcr, _, balance_option = balance.options
    assert got == {
        "communicators": [
            {
                "comm_id": 5,
                "mitigation": "nvl",
                "predicted_k": nvl.chosen.k,
                "why": nvl.reason,
                "disabled_channels": [],
                "channel_weights": [],
                "allreduce_split": None,
                "transit": [{"rank": 0, "gpu": 1}, {"rank": 2, "gpu": 1}],
                "options": [
                    {
                        "mitigation": o.mitigation.value,
                        "applicable": o.applicable,
                        "k": o.k,
                        "why": o.why,
                        **o.detail,
                    }
                    for o in nvl.options
                ],
            },
            {
                "comm_id": 3,
                "mitigation": "balance",
                "predicted_k": balance.chosen.k,
                "why": balance.reason,
                "disabled_channels": [0, 2],
                "channel_weights": [0.25, 0.25, 0.25, 0.25],
                "allreduce_split": 1 / 3,
                "transit": [],
                "options": [
                    {
                        "mitigation": "s-bond",
                        "applicable": True,
                        "k": sbond.k,
                        "why": sbond.why,
                        "load": 3,
                    },
                    {
                        "mitigation": "dcr",
                        "applicable": True,
                        "k": dcr.k,
                        "why": dcr.why,
                        "disabled_channels": 2,
                    },
                    {
                        "mitigation": "nvl",
                        "applicable": False,
                        "k": None,
                        "why": "no peer GPU with NVLink and a healthy RNIC",
                    },
                    {
                        "mitigation": "balance",
                        "applicable": True,
                        "k": balance_option.k,
                        "why": balance_option.why,
                        "bandwidth_left": 0.5,
                        "allreduce_handoff": 1 / 3,
                    },
                ],
            },
        ]
    }
    assert type(got["communicators"][1]["disabled_channels"]) is list
    assert describe((CommSpec(3, 4),), set()) == {"communicators": []}


def with_mitigations(comms: tuple[CommSpec, ...], base: Desired, **job_kw: Any) -> Desired:
    failed = FailedSet(links=frozenset({("a", "mlx5_0", 1)}))
    fabric = FabricView(TOPOS, PLANS, failed)
    routes = tuple(route_ranks(RANKS, PLANS, TOPOS, failed))
    job = a_job(RANKS, mode=Mode.FAILED_OVER, communicators=comms, comm_share=0.45, **job_kw)
    conn = Connectivity(routes, 0, 0, (), (), ())
    moved = {0: "mlx5_1/1", 2: "mlx5_1/1"}
    return engine_with_mitigations(job, fabric, conn, base, moved, options=OPTIONS)


STALE = Desired(
    mode=Mode.FAILED_OVER,
    disabled={9: (1,)},
    mitigation={9: "dcr"},
    weights={9: (1.0,)},
    split={9: 0.5, 3: 0.9},
    transit={9: {1: 1}},
)


def test_with_mitigations_replaces_every_plan_of_the_communicators() -> None:
    got = with_mitigations((CommSpec(5, 4, ranks=(0, 2, 3, 5)), CommSpec(3, 4)), STALE)
    assert got == Desired(
        mode=Mode.FAILED_OVER,
        moved={0: "mlx5_1/1", 2: "mlx5_1/1"},
        disabled={3: (0, 2)},
        mitigation={5: "nvl", 3: "balance"},
        weights={3: (0.25, 0.25, 0.25, 0.25)},
        split={3: 1 / 3},
        transit={5: {0: 1, 2: 1}},
    )


def test_with_mitigations_for_stock_nccl_clears_every_plan() -> None:
    spec = NcclSpec((2, 29, 7), port_failover=True)
    got = with_mitigations((CommSpec(3, 4),), STALE, nccl=spec)
    assert got == Desired(mode=Mode.FAILED_OVER, moved={0: "mlx5_1/1", 2: "mlx5_1/1"})


def test_an_index_built_for_other_communicators_is_not_read() -> None:
    """A communicator's members come from the connectivity's index only when it was built
    for the job's communicators; from any other index the plans are the routes' plans."""
    comms = (CommSpec(5, 4, ranks=(0, 2, 3, 5)), CommSpec(6, 4, ranks=(4,)))
    links = {("a", "mlx5_0", 1)}
    failed = FailedSet(links=frozenset(links))
    fabric = FabricView(TOPOS, PLANS, failed)
    job = a_job(RANKS, communicators=comms, comm_share=0.45)
    expected = plans_for(links, comms)
    assert [(p.comm_id, p.ranks) for p in expected] == [(5, (0, 2, 3, 5))]
    for built_for in (
        comms,
        (),  # fewer communicators
        (*comms, CommSpec(7, 2)),  # more
        (CommSpec(8, 4, ranks=(4,)), CommSpec(9, 4, ranks=(0, 2, 3, 5))),  # as many, others
    ):
        index = jobindex.build(RANKS, PLANS, TOPOS, built_for)
        conn = jobindex.connectivity(index, failed, PLANS, TOPOS)
        assert conn.index is index
        assert plan_mitigations(job, fabric, conn, OPTIONS) == expected, built_for

"""s-Bond with RDMA devices that are not one PCI function each (issue 31): soft devices are
never used, and a backup never shares a PCI function with its primary (an SF or VF of the
primary's function, a bond over it)."""

from __future__ import annotations

import pytest

from scheduler_svc.engine.paths import Gpu, NodeTopology, Rnic, plan_node


def _rnic(name: str, rail: int, pci: str | None, **kw: object) -> Rnic:
    # Every candidate on one PCIe switch and NUMA node, so cost ties and the name decides:
    # only the hardware rule keeps a sharing device from being chosen.
    return Rnic(
        name,
        1,
        pci,
        numa=0,
        pcie_switch="sw0",
        root_complex="rc0",
        switch=f"rail{rail}",
        rail=rail,
        **kw,  # type: ignore[arg-type]  # kind/physfn/members, checked by the dataclass
    )


GPU = Gpu(0, "0000:10:00.0", 0, "sw0", "rc0")


def test_a_soft_device_in_the_rail_map_is_never_a_primary_nor_a_backup() -> None:
    node = NodeTopology(
        "n",
        (GPU,),
        (
            _rnic("a_rxe0", 0, None, kind="soft"),  # sorts first: would win every tie
            _rnic("mlx5_0", 1, "0000:11:00.0"),
            _rnic("mlx5_1", 2, "0000:12:00.0"),
        ),
    )
    plan = plan_node(node)
    (g,) = plan.gpus
    assert (g.primary, g.backup) == ("mlx5_0/1", "mlx5_1/1")
    assert (
        "a_rxe0/1 is a software RDMA device (soft: rxe, siw): never a primary or backup"
        in plan.warnings
    )


@pytest.mark.parametrize(
    "sharing",
    [
        # A scalable function of the primary's PCI function.
        _rnic("mlx5_0a", 1, "0000:11:00.0", kind="sf"),
        # An SR-IOV VF whose physical function is the primary's.
        _rnic("mlx5_0a", 1, "0000:11:00.1", kind="vf", physfn="0000:11:00.0"),
        # A RoCE bond with the primary's function among its members.
        _rnic(
            "mlx5_0a",
            1,
            "0000:13:00.0",
            kind="bond",
            members=("0000:11:00.0", "0000:13:00.0"),
        ),
    ],
    ids=["sf", "vf", "bond"],
)
def test_a_backup_never_shares_a_pci_function_with_its_primary(sharing: Rnic) -> None:
    primary = _rnic("mlx5_0", 0, "0000:11:00.0")
    other = _rnic("mlx5_9", 2, "0000:19:00.0")
    node = NodeTopology("n", (GPU,), (primary, sharing, other))
    (g,) = plan_node(node).gpus
    assert (g.primary, g.backup) == ("mlx5_0/1", "mlx5_9/1")
    # With nothing else, no backup, and the warning says why.
    alone = plan_node(NodeTopology("n", (GPU,), (primary, sharing)))
    assert alone.gpus[0].backup is None
    assert any(
        "mlx5_0a share PCI functions with mlx5_0" in w and "one failure takes both" in w
        for w in alone.warnings
    )


def test_two_bonds_over_different_cards_back_each_other_up() -> None:
    a = _rnic(
        "mlx5_bond_0", 0, "0000:11:00.0", kind="bond", members=("0000:11:00.0", "0000:11:00.1")
    )
    b = _rnic(
        "mlx5_bond_1", 1, "0000:21:00.0", kind="bond", members=("0000:21:00.0", "0000:21:00.1")
    )
    (g,) = plan_node(NodeTopology("n", (GPU,), (a, b))).gpus
    assert (g.primary, g.backup) == ("mlx5_bond_0/1", "mlx5_bond_1/1")

"""NCCL's own failover domain, table-driven: what stock NCCL survives by itself."""

from __future__ import annotations

import pytest

from scheduler_svc.engine.nccl import (
    Device,
    NcclSpec,
    Outcome,
    RankDevice,
    assess,
    parse_version,
    virtual_nics,
)

PAIRS = (frozenset({"mlx5_0", "mlx5_1"}), frozenset({"mlx5_2", "mlx5_3"}))
ON = NcclSpec((2, 29, 7), port_failover=True, merged_nics=PAIRS)
# Four GPUs of node a, each on the nearest device; mlx5_4 merges with nothing.
RANKS = [RankDevice(i, "a", f"mlx5_{i}") for i in range(4)] + [RankDevice(4, "a", "mlx5_4")]


def node(*failed: str) -> dict[str, list[Device]]:
    return {"a": [Device(f"mlx5_{i}", f"mlx5_{i}" not in failed) for i in range(5)]}


RUNS_ON = ("failover", "restart", "restart_scaled")
RESTART_ONLY = ("restart", "restart_scaled")
OFF = NcclSpec((2, 29, 7), port_failover=False, merged_nics=PAIRS)
OLD = NcclSpec((2, 28, 3), port_failover=True, merged_nics=PAIRS)

# story, spec, failed devices -> (outcome, degraded ranks, fatal ranks)
CASES = [
    ("one device of a merged pair: NCCL fails over to its partner",
     ON, ("mlx5_0",), (Outcome.FAILS_OVER, (0, 1), ())),
    ("both devices of one pair: fatal inside NCCL",
     ON, ("mlx5_0", "mlx5_1"), (Outcome.FATAL, (), (0, 1))),
    ("one device of each pair: both virtual NICs run on",
     ON, ("mlx5_0", "mlx5_3"), (Outcome.FAILS_OVER, (0, 1, 2, 3), ())),
    ("a virtual NIC of one device: fatal",
     ON, ("mlx5_4",), (Outcome.FATAL, (), (4,))),
    ("one pair survives, another is gone: the job is lost",
     ON, ("mlx5_0", "mlx5_2", "mlx5_3"), (Outcome.FATAL, (0, 1), (2, 3))),
    ("port failover off: a merged pair does not save it",
     OFF, ("mlx5_0",), (Outcome.FATAL, (), (0, 1))),
    ("asked for port failover on NCCL 2.28, which has none",
     OLD, ("mlx5_0",), (Outcome.FATAL, (), (0, 1))),
    ("nothing failed", ON, (), (Outcome.UNTOUCHED, (), ())),
]  # fmt: skip
ACTIONS = {Outcome.FAILS_OVER: RUNS_ON, Outcome.FATAL: RESTART_ONLY, Outcome.UNTOUCHED: ("none",)}


@pytest.mark.parametrize(("story", "spec", "failed", "expected"), CASES)
def test_failover_domain(
    story: str,
    spec: NcclSpec,
    failed: tuple[str, ...],
    expected: tuple[Outcome, tuple[int, ...], tuple[int, ...]],
) -> None:
    got = assess(spec, node(*failed), RANKS)
    assert (got.outcome, got.degraded_ranks, got.fatal_ranks) == expected, story
    assert got.actions == ACTIONS[expected[0]]
    assert got.path_available == (expected[0] != Outcome.FATAL)
    assert got.reason.startswith("NCCL 2.")


def test_reasons_say_what_nccl_does() -> None:
    assert "fails over to its healthy partner itself" in assess(ON, node("mlx5_1"), RANKS).reason
    assert (
        "every device of the virtual NIC is lost"
        in assess(ON, node("mlx5_0", "mlx5_1"), RANKS).reason
    )
    assert "no partner" in assess(ON, node("mlx5_4"), RANKS).reason
    off = NcclSpec((2, 29, 7), port_failover=False, merged_nics=PAIRS)
    assert "port failover is not active" in assess(off, node("mlx5_0"), RANKS).reason


def test_degraded_bandwidth_is_the_worst_virtual_nic_share() -> None:
    assert assess(ON, node("mlx5_0"), RANKS).bandwidth_left == 0.5
    triple = NcclSpec((2, 30, 0), True, merged_nics=(frozenset({"mlx5_0", "mlx5_1", "mlx5_2"}),))
    assert assess(triple, node("mlx5_0"), RANKS).bandwidth_left == pytest.approx(2 / 3)


def test_a_failure_no_rank_uses_touches_nothing() -> None:
    ranks = [RankDevice(0, "a", "mlx5_0")]
    got = assess(ON, node("mlx5_2", "mlx5_3"), ranks)  # the other pair, unused
    assert got.outcome == Outcome.UNTOUCHED and got.vnics == ()
    # Ranks on other nodes are not looked at: only nodes with a failure are given.
    assert assess(ON, node("mlx5_0"), [RankDevice(0, "b", "mlx5_0")]).outcome == Outcome.UNTOUCHED


def test_merge_policies() -> None:
    devices = [
        Device("mlx5_0", True, rail=0, pcie_switch="sw0"),
        Device("mlx5_1", True, rail=1, pcie_switch="sw0"),
        Device("mlx5_2", True, rail=0, pcie_switch="sw1"),
        Device("mlx5_3", True, rail=None, pcie_switch=None),
    ]
    by_switch = NcclSpec((2, 29, 7), True, merge="pcie_switch")
    assert set(virtual_nics(by_switch, devices)) == {
        frozenset({"mlx5_0", "mlx5_1"}),
        frozenset({"mlx5_2"}),
        frozenset({"mlx5_3"}),
    }
    by_rail = NcclSpec((2, 29, 7), True, merge="rail")
    assert set(virtual_nics(by_rail, devices)) == {
        frozenset({"mlx5_0", "mlx5_2"}),
        frozenset({"mlx5_1"}),
        frozenset({"mlx5_3"}),
    }
    # Explicit groups keep only the devices the node has.
    assert set(virtual_nics(ON, devices[:1])) == {frozenset({"mlx5_0"})}


def test_versions() -> None:
    assert parse_version("2.29.7") == (2, 29, 7)
    assert parse_version("2.30") == (2, 30, 0)
    with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
        parse_version("2.29.7-rc1")
    assert ON.fails_over and not ON.recovers_ports
    assert NcclSpec((2, 30, 1), True).recovers_ports
    spec = NcclSpec.from_declaration(
        {"kind": "nccl", "version": "2.30", "port_failover": True, "merged_nics": [["a", "b"]]}
    )
    assert spec == NcclSpec((2, 30, 0), True, "explicit", (frozenset({"a", "b"}),))

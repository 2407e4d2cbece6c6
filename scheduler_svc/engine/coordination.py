"""Cluster-wide coordination, pure: mitigations and their k, switch points, flaps, correlation.

Everything here is a function of its arguments (time included), so the
service, the simulator and the tests reach the same answers.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta


class Mitigation(enum.StrEnum):
    """How a job runs after failover, cheapest predicted k wins (ReCCL, R²CCL)."""

    SBOND = "s-bond"  # failed-over channels share the backup RNIC
    DCR = "dcr"  # disable the failed-over channels, spread their data over the rest
    NVL = "nvl"  # transit through a peer GPU over NVLink to its RNIC
    BALANCE = "balance"  # R²CCL: load in proportion to bandwidth left, allreduce split


@dataclass(frozen=True, slots=True)
class Option:
    mitigation: Mitigation
    applicable: bool
    k: float | None
    why: str
    detail: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MitigationPlan:
    chosen: Option
    options: tuple[Option, ...]
    reason: str


def allreduce_handoff(bandwidth_left: float, nodes: int) -> float:
    """R²CCL-AllReduce: the share of an allreduce the degraded node hands to the others.

    Normally every node moves 2·D. If the degraded node (bandwidth fraction f)
    hands off a share h, it moves 2·D·(1 − h) at speed f while each of the
    N − 1 others moves 2·D·(1 + h/(N − 1)) at full speed. Equal finishing
    times give h = (1 − f) / (1 + f/(N − 1)); f = 7/8 with many nodes gives
    h ≈ 1/8, the 1.75·D instead of 2·D of the paper.
    """
    if not 0 < bandwidth_left <= 1:
        raise ValueError(f"bandwidth_left must be within (0, 1], got {bandwidth_left}")
    if nodes < 2:
        return 0.0
    return (1 - bandwidth_left) / (1 + bandwidth_left / (nodes - 1))


def balance_weights(bandwidth: dict[str, float]) -> dict[str, float]:
    """R²CCL-Balance: each node's share of the traffic, in proportion to its bandwidth left."""
    total = sum(bandwidth.values())
    if total <= 0:
        raise ValueError("no bandwidth left on any node")
    return {node: bw / total for node, bw in sorted(bandwidth.items())}


def plan_mitigation(
    *,
    comm_share: float,
    rails_per_node: int,
    failed_rails: int,
    channels: int,
    nodes: int,
    backup_load: int = 2,
    backup_crosses_root_complex: bool = False,
    cross_rc_throughput: float = 0.5,
    nvl_available: bool = False,
    nvl_mb_per_channel: float = 40.0,
    nvl_cap_mb: float = 512.0,
    nvl_ranks_per_gpu: int = 1,
) -> MitigationPlan:
    """Predict k under each mitigation for the worst-hit node and choose the lowest.

    `rails_per_node` is how many RNICs (rails) the communicator's ranks on one
    node use; `failed_rails` how many of those failed on the worst node.
    Channels map onto rails round-robin, so DCR applies only when the
    communicator spans at least two rails (large groups) and has channels on
    a surviving one. `backup_load` is how many rails' traffic the busiest
    backup RNIC carries under s-Bond. The cross-root-complex PCIe throughput
    is an assumption (a parameter), not a measurement. NVL transit costs
    `nvl_mb_per_channel` per channel of every rank sent through one transit GPU
    (`nvl_ranks_per_gpu` at most on one), refused over `nvl_cap_mb` (ReCCL §3.2.2).
    """
    if rails_per_node < 1 or not 0 <= failed_rails <= rails_per_node:
        raise ValueError("need 1 <= rails_per_node and 0 <= failed_rails <= rails_per_node")
    s = comm_share
    options = [
        _sbond(
            s,
            backup_load=backup_load,
            crosses=backup_crosses_root_complex,
            cross_rc_throughput=cross_rc_throughput,
        ),
        _dcr(s, rails_per_node=rails_per_node, failed_rails=failed_rails, channels=channels),
        _nvl(
            s,
            backup_load=backup_load,
            nvl_mb=nvl_mb_per_channel * channels * max(1, nvl_ranks_per_gpu),
            available=nvl_available,
            cap_mb=nvl_cap_mb,
        ),
        _balance(s, rails_per_node=rails_per_node, failed_rails=failed_rails, nodes=nodes),
    ]
    usable = [o for o in options if o.applicable and o.k is not None]
    chosen = min(usable, key=lambda o: (o.k, list(Mitigation).index(o.mitigation)))
    others = ", ".join(f"{o.mitigation.value} k={o.k:.3f}" for o in usable if o is not chosen)
    reason = f"{chosen.mitigation.value} (k={chosen.k:.3f}): {chosen.why}" + (
        f"; beats {others}" if others else ""
    )
    return MitigationPlan(chosen, tuple(options), reason)


def _sbond(s: float, *, backup_load: int, crosses: bool, cross_rc_throughput: float) -> Option:
    sbond_factor = backup_load / (cross_rc_throughput if crosses else 1.0)
    return Option(
        Mitigation.SBOND,
        True,
        1 + s * (sbond_factor - 1),
        f"the busiest backup RNIC carries {backup_load} rails' traffic"
        + (", across root complexes" if crosses else ""),
        {"load": backup_load},
    )


def _dcr(s: float, *, rails_per_node: int, failed_rails: int, channels: int) -> Option:
    surviving = rails_per_node - failed_rails
    channels_on_failed = sum(1 for c in range(channels) if c % rails_per_node < failed_rails)
    if rails_per_node >= 2 and surviving >= 1 and channels - channels_on_failed >= 1:
        factor = channels / (channels - channels_on_failed)
        return Option(
            Mitigation.DCR,
            True,
            1 + s * (factor - 1),
            f"disable {channels_on_failed} of {channels} channels; the rest use disjoint RNICs",
            {"disabled_channels": channels_on_failed},
        )
    return Option(
        Mitigation.DCR,
        False,
        None,
        "channels do not use disjoint RNICs (the communicator has one rail per node)",
    )


def _nvl(s: float, *, backup_load: int, nvl_mb: float, available: bool, cap_mb: float) -> Option:
    if available and nvl_mb <= cap_mb:
        return Option(
            Mitigation.NVL,
            True,
            1 + s * (backup_load - 1),
            f"transit over NVLink to a peer GPU's RNIC ({nvl_mb:.0f} MB of GPU memory)",
            {"gpu_memory_mb": nvl_mb},
        )
    why = (
        "no peer GPU with NVLink and a healthy RNIC"
        if not available
        else f"needs {nvl_mb:.0f} MB of GPU memory, over the {cap_mb:.0f} MB cap"
    )
    return Option(Mitigation.NVL, False, None, why)


def _balance(s: float, *, rails_per_node: int, failed_rails: int, nodes: int) -> Option:
    surviving = rails_per_node - failed_rails
    if rails_per_node >= 2 and surviving >= 1:
        f = surviving / rails_per_node
        h = allreduce_handoff(f, nodes)
        return Option(
            Mitigation.BALANCE,
            True,
            1 + s * ((1 - h) / f - 1),
            f"weights by bandwidth left ({f:.0%} on the degraded node), "
            f"which hands off {h:.1%} of each allreduce",
            {"bandwidth_left": f, "allreduce_handoff": h},
        )
    return Option(Mitigation.BALANCE, False, None, "no surviving rail to balance onto")


@dataclass(frozen=True, slots=True)
class SwitchPoint:
    ops_done: int
    offset: int
    reason: str


def switch_point(
    *,
    max_ops_done: int,
    op_rate_per_s: float | None,
    delivery_latency_s: float,
    min_offset: int,
    safety: float = 2.0,
) -> SwitchPoint:
    """The op count every rank switches at: highest reported ops_done + offset.

    The offset covers the ops that run while the command travels to every
    rank (op rate × delivery latency, with a safety factor), never below
    `min_offset`.
    """
    if op_rate_per_s is None or op_rate_per_s <= 0:
        return SwitchPoint(max_ops_done + min_offset, min_offset, "op rate unknown: minimum offset")
    needed = math.ceil(op_rate_per_s * delivery_latency_s * safety)
    offset = max(min_offset, needed)
    return SwitchPoint(
        max_ops_done + offset,
        offset,
        f"{op_rate_per_s:.1f} ops/s x {delivery_latency_s * 1000:.0f} ms delivery x {safety:g}",
    )


class PortState(enum.StrEnum):
    DOWN = "down"
    DAMPING = "damping"  # up again, but not yet for long enough to fail back
    HEALTHY = "healthy"  # up and quiet for the damping period: fail back
    FLAPPING = "flapping"  # too many downs in the window: stay on backup, flag it


@dataclass(frozen=True, slots=True)
class PortHealth:
    state: PortState
    downs_in_window: int
    failback_at: datetime | None
    reason: str


def port_health(
    transitions: Sequence[tuple[datetime, bool]],
    now: datetime,
    *,
    damping_s: float,
    max_flaps: int,
    window_s: float,
) -> PortHealth:
    """Fail over at once, fail back after `damping_s` quiet; more than `max_flaps` downs flags it.

    `transitions` are (time, up) pairs, oldest first.
    """
    if not transitions:
        return PortHealth(PortState.HEALTHY, 0, None, "no transitions")
    window_start = now - timedelta(seconds=window_s)
    downs = sum(1 for t, up in transitions if not up and t >= window_start)
    last_t, last_up = transitions[-1]
    if downs > max_flaps:
        return PortHealth(
            PortState.FLAPPING,
            downs,
            None,
            f"{downs} downs in {window_s:.0f} s (more than {max_flaps}): stays on its backup",
        )
    if not last_up:
        return PortHealth(PortState.DOWN, downs, None, "port is down")
    ready = last_t + timedelta(seconds=damping_s)
    if now < ready:
        return PortHealth(
            PortState.DAMPING,
            downs,
            ready,
            f"up since {last_t.isoformat()}, damping {damping_s:g} s",
        )
    return PortHealth(PortState.HEALTHY, downs, ready, f"up and quiet for {damping_s:g} s")


@dataclass(frozen=True, slots=True)
class PortFault:
    node: str
    device: str
    port: int
    switch: str | None
    at: datetime


@dataclass(frozen=True, slots=True)
class SwitchFailure:
    switch: str
    nodes: tuple[str, ...]
    first_at: datetime
    reason: str


def infer_switch_failures(
    faults: Iterable[PortFault], *, window_s: float, min_nodes: int
) -> list[SwitchFailure]:
    """Faults on ports cabled to one switch, from `min_nodes` nodes within `window_s`: the switch.

    One node losing several ports is a node (or NIC) problem; several nodes
    losing the port on one switch at once is the switch.
    """
    by_switch: dict[str, list[PortFault]] = {}
    for f in faults:
        if f.switch is not None:
            by_switch.setdefault(f.switch, []).append(f)
    found = []
    for switch, group in sorted(by_switch.items()):
        group.sort(key=lambda f: f.at)
        for i, first in enumerate(group):
            end = first.at + timedelta(seconds=window_s)
            nodes = sorted({f.node for f in group[i:] if f.at <= end})
            if len(nodes) >= min_nodes:
                found.append(
                    SwitchFailure(
                        switch,
                        tuple(nodes),
                        first.at,
                        f"{len(nodes)} nodes lost their port on {switch} within {window_s:g} s",
                    )
                )
                break
    return found


def is_node_failure(
    failed_ports: Iterable[tuple[str, int]], fabric_ports: Iterable[tuple[str, int]]
) -> bool:
    """Every GPU-fabric port of a node failed: the node (or its power) died, not the network."""
    fabric = set(fabric_ports)
    return bool(fabric) and fabric <= set(failed_ports)


@dataclass(frozen=True, slots=True)
class MeasuredK:
    k: float | None
    trustworthy: bool
    reason: str


def measured_k(
    baseline_s: Sequence[float],
    degraded_s: Sequence[float],
    *,
    min_samples: int = 5,
    max_spread: float = 0.25,
) -> MeasuredK:
    """k = median degraded iteration time / median healthy iteration time, once it is steady.

    Trustworthy once both sides have `min_samples` and the degraded samples'
    interquartile range is within `max_spread` of their median (a job still
    warming up or checkpointing gives noisy times).
    """
    if len(baseline_s) < min_samples or len(degraded_s) < min_samples:
        return MeasuredK(
            None,
            False,
            f"{len(baseline_s)} healthy and {len(degraded_s)} degraded samples; "
            f"need {min_samples} each",
        )
    base = statistics.median(baseline_s)
    deg = statistics.median(degraded_s)
    if base <= 0:
        return MeasuredK(None, False, "healthy iteration time is not positive")
    q = statistics.quantiles(degraded_s, n=4)
    spread = (q[2] - q[0]) / deg if deg > 0 else math.inf
    k = max(1.0, deg / base)
    if spread > max_spread:
        return MeasuredK(k, False, f"degraded times spread {spread:.0%} > {max_spread:.0%}")
    return MeasuredK(k, True, f"median {deg:.3f} s vs {base:.3f} s healthy")


def restart_at_checkpoint(
    *, k: float, reload_s: float, repair_s: float, spare_price_s: float = 0.0
) -> tuple[bool, str]:
    """At a checkpoint while failed over: restart cleanly now, or run degraded until repair?

    Running degraded costs (k − 1)·X extra for the X seconds until the repair;
    a clean restart onto healthy hardware costs T_reload once, plus what the spare it
    takes costs the faults only a replacement fixes (decision.spare_price_s).
    """
    extra = (k - 1) * repair_s
    restart = reload_s + spare_price_s
    said = f"reload {reload_s:.0f} s"
    if spare_price_s > 0:
        said += f" + {spare_price_s:.0f} s the spare is worth to lost GPUs and dead nodes"
    if restart < extra:
        return True, (
            f"restart at this checkpoint: {said} < {extra:.0f} s lost running "
            f"degraded (k={k:.3f}) until the repair in {repair_s:.0f} s"
        )
    return False, (
        f"keep running degraded: {extra:.0f} s lost until the repair in {repair_s:.0f} s "
        f"(k={k:.3f}) <= {said}"
    )

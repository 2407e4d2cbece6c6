"""Failover-or-restart decision: ReCCL equations (1)-(4) and their options.

Every cost here is measured the same way, so they can be compared: the wall
time from the fault until the job has again done all the work up to the end
of the current checkpoint interval. Pure arithmetic: the helpers work on
floats and on numpy arrays alike, which is how the Monte Carlo simulator
reuses them without writing the rule twice.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np
import numpy.typing as npt

# IB local ACK timeout unit: 4.096 µs · 2^timeout per retry (IBTA vol. 1, 9.7.6.1.3).
IB_TIMEOUT_UNIT_S = 4.096e-6

# The cost formulas serve scalars (the service) and arrays (the simulator) alike.
Num = TypeVar("Num", float, npt.NDArray[np.float64])


class Action(enum.StrEnum):
    """What the service tells the fleet to do with a job after a fault."""

    FAILOVER = "failover"
    RESTART = "restart"
    RESTART_SCALED = "restart_scaled"
    NONE = "none"


class Policy(enum.StrEnum):
    """How the service answers a fault: its own cost model, or one of the behaviours it is
    compared with (the fleet twin runs each on the same trace; RAILOVER_POLICY)."""

    RAILOVER = "railover"  # ReCCL's cost model at the fault, the repair rule at checkpoints
    RESTART_ONLY = "restart-only"  # every fault that hits a rank restarts the job
    NCCL_FAILOVER_ONLY = "nccl-failover-only"  # fail over where a path is left, never back
    FAILOVER_ALWAYS = "failover-always"  # fail over where a path is left, whatever it costs

    @property
    def restarts_at_checkpoints(self) -> bool:
        """Whether a failed-over job may restart at a checkpoint (the repair rule)."""
        return self == Policy.RAILOVER

    @property
    def fails_back(self) -> bool:
        """Whether ranks return to a primary that is healthy again (NCCL's partner device
        stays until the job restarts)."""
        return self != Policy.NCCL_FAILOVER_ONLY


def with_policy(d: Decision, policy: Policy) -> Decision:
    """`d` as `policy` answers it: the costs stay as computed, the action may not."""
    if policy == Policy.RAILOVER or d.action == Action.NONE:
        return d
    if policy == Policy.RESTART_ONLY:
        if d.action == Action.FAILOVER and not d.inputs.planned:
            why = "policy restart-only: every fault that hits a rank restarts the job"
            return replace(d, action=Action.RESTART, reason=f"{why} ({d.reason})")
        return d
    if d.costs_s.get(Action.FAILOVER.value) is not None and d.action != Action.FAILOVER:
        why = f"policy {policy.value}: fail over wherever a path is left"
        return replace(d, action=Action.FAILOVER, reason=f"{why} ({d.reason})")
    return d


def ib_timeout_s(timeout_exponent: int, retry_cnt: int) -> float:
    """Seconds before an RNIC gives up on a dead path: 4.096 µs · 2^timeout · (retry_cnt + 1)."""
    if not 0 <= timeout_exponent <= 31:
        raise ValueError(f"timeout_exponent must be 0..31 (IB 5-bit field), got {timeout_exponent}")
    if not 0 <= retry_cnt <= 7:
        raise ValueError(f"retry_cnt must be 0..7 (IB 3-bit field), got {retry_cnt}")
    return IB_TIMEOUT_UNIT_S * float(1 << timeout_exponent) * (retry_cnt + 1)


def restart_cost_s(interval_s: Num, detect_s: Num, reload_s: Num, timeout_s: Num) -> Num:
    """Equation (1): t_restart = T_timeout + T_detect + T_reload + T_interval."""
    return timeout_s + detect_s + reload_s + interval_s


def failover_cost_s(interval_s: Num, elapsed_s: Num, reload_s: Num, timeout_s: Num, k: Num) -> Num:
    """Equation (2): t_failover = T_timeout + k·(T_interval − t_elapsed) + T_reload."""
    return timeout_s + k * (interval_s - elapsed_s) + reload_s


def failover_threshold_s(interval_s: Num, detect_s: Num, k: Num) -> Num:
    """Equation (4): fail over once t_elapsed > (T_interval·(k − 1) − T_detect) / k."""
    return (interval_s * (k - 1) - detect_s) / k


def restart_scaled_cost_s(
    interval_s: float,
    detect_s: float,
    reload_s: float,
    timeout_s: float,
    dp_size: int,
    *,
    new_dp_size: int,
) -> float:
    """Restart without the faulty node(s): DP shrinks to new_dp_size, the interval runs
    dp_size/new_dp_size longer (the same work on fewer replicas)."""
    if not 1 <= new_dp_size < dp_size:
        raise ValueError(
            f"restart_scaled needs 1 <= new_dp_size < dp_size, got {new_dp_size} of {dp_size}"
        )
    return timeout_s + detect_s + reload_s + interval_s * dp_size / new_dp_size


def saved_gpu_s(
    action: str, costs_s: Mapping[str, float | None], gpus: int, *, moved: bool
) -> float:
    """GPU time one decision saved against restarting: Railover's one definition.

    Only a failover that moved some rank saves anything: (the cheapest restart
    option's cost - failover's cost) · the job's GPUs, in GPU-seconds. A failover
    that costs more than restarting (one planned ahead of a maintenance) saves 0,
    as do restarts, none, fail-backs and re-decisions that moved no rank. The
    status page, /metrics, the demo and each decision record all use this.
    """
    failover = costs_s.get(Action.FAILOVER.value)
    restarts = [
        c
        for c in (costs_s.get(Action.RESTART.value), costs_s.get(Action.RESTART_SCALED.value))
        if c is not None
    ]
    if action != Action.FAILOVER.value or not moved or failover is None or not restarts:
        return 0.0
    return max(0.0, min(restarts) - failover) * gpus


def total_saved_gpu_s(saved: Iterable[float]) -> float:
    """The decisions' saved GPU-seconds summed exactly (fsum: the same in any order)."""
    return math.fsum(saved)


@dataclass(frozen=True, slots=True)
class DecisionInputs:
    """Everything one decision depends on; stored verbatim with the decision."""

    checkpoint_interval_s: float
    elapsed_s: float
    detect_s: float
    reload_s: float
    timeout_s: float
    k: float
    k_source: str
    gpus: int
    path_available: bool = True
    healed: bool = False
    # False when the fault only took backups: every rank still runs on its primary.
    affected: bool = True
    dp_size: int = 1
    # DP size after dropping the nodes that hold the failed part (engine.layout); None
    # when the job's layout and placement leave no replica to run: no restart_scaled.
    new_dp_size: int | None = None
    allow_scaling: bool = False
    spare_nodes: bool = True
    # How many spares are free (None: not said), and how many are kept back for faults only
    # a replacement fixes (spare_usable).
    spares_free: int | None = None
    spare_reserve: int = 0
    node_replace_s: float = 0.0
    # What taking a spare costs the faults only a replacement fixes (spare_price_s).
    spare_price_s: float = 0.0
    # Planned maintenance: the ranks move before the target goes down, so nothing is
    # lost and no collective hangs; only a GPU left without any path restarts.
    planned: bool = False

    def __post_init__(self) -> None:
        positive = {"checkpoint_interval_s": self.checkpoint_interval_s, "gpus": self.gpus}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        non_negative = {
            "elapsed_s": self.elapsed_s,
            "detect_s": self.detect_s,
            "reload_s": self.reload_s,
            "timeout_s": self.timeout_s,
            "node_replace_s": self.node_replace_s,
            "spare_price_s": self.spare_price_s,
        }
        for name, value in non_negative.items():
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not (self.k >= 1 and math.isfinite(self.k)):
            raise ValueError(f"k (slowdown while failed over) must be >= 1, got {self.k}")
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.new_dp_size is not None and not 1 <= self.new_dp_size < self.dp_size:
            raise ValueError(
                f"new_dp_size must be 1..dp_size-1 ({self.dp_size - 1}), got {self.new_dp_size}"
            )


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen action, the threshold, every option's cost and a reason a person can read."""

    action: Action
    reason: str
    threshold_s: float
    costs_s: dict[str, float | None]
    costs_gpu_s: dict[str, float | None]
    inputs: DecisionInputs
    notes: tuple[str, ...] = field(default=())


def _fmt(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def decide(inp: DecisionInputs) -> Decision:
    """Pick the cheapest of failover, restart, restart_scaled and none for one fault."""
    interval, elapsed = inp.checkpoint_interval_s, min(inp.elapsed_s, inp.checkpoint_interval_s)
    notes: list[str] = []
    if inp.elapsed_s > inp.checkpoint_interval_s:
        notes.append(
            f"t_elapsed {_fmt(inp.elapsed_s)} exceeds the checkpoint interval; "
            "capped at the interval (a checkpoint is overdue)"
        )
    threshold = failover_threshold_s(interval, inp.detect_s, inp.k)
    options = _Costs.of(inp, elapsed)
    if options.takes_spare and inp.spare_price_s > 0:
        notes.append(
            f"a restart takes one of {inp.spares_free} free spares: {_fmt(inp.spare_price_s)} "
            "of its cost is the wait it may leave a lost GPU or dead node"
        )
    costs: dict[str, float | None] = {
        Action.FAILOVER.value: options.failover,
        Action.RESTART.value: options.restart,
        Action.RESTART_SCALED.value: options.scaled,
        Action.NONE.value: options.none,
    }
    # The scaled restart runs on the replicas that are left.
    gpu_share = {
        Action.RESTART_SCALED.value: 1.0
        if inp.new_dp_size is None
        else inp.new_dp_size / inp.dp_size
    }
    costs_gpu = {
        name: None if cost is None else cost * inp.gpus * gpu_share.get(name, 1.0)
        for name, cost in costs.items()
    }
    action, reason = _cheapest(inp, options, elapsed=elapsed, threshold=threshold)
    return Decision(
        action=action,
        reason=reason,
        threshold_s=threshold,
        costs_s=costs,
        costs_gpu_s=costs_gpu,
        inputs=inp,
        notes=tuple(notes),
    )


def spare_usable(
    spare_nodes: bool, spares_free: int | None, reserve: int, *, can_fail_over: bool
) -> bool:
    """Whether a restart may take a spare node: one is free and, where the job could fail
    over instead, more than the `reserve` kept for faults only a replacement fixes (a lost
    GPU, a dead node). With 8 spares and repairs of a day, restarts for cables that could
    have failed over used up the pool, and the GPU losses after them waited (the fleet
    twin, 256 nodes, a week at 100x the papers' rates)."""
    if not spare_nodes:
        return False
    return not can_fail_over or spares_free is None or spares_free > reserve


def spare_price_s(
    spares_free: int | None, hard_failures_per_h: float, hold_s: float, replace_s: float
) -> float:
    """What taking a free spare costs the faults only a replacement fixes (a lost GPU, a
    dead node), in seconds of a job's time. The spare is away for `hold_s`, until the
    node it replaces is repaired; it is missed if `spares_free` or more such faults come
    meanwhile (a Poisson process at `hard_failures_per_h` across the fleet), and then one
    of them waits `replace_s` for a node. Priced for a job of the same size as the one
    taking the spare. 0 when the free count is not known or no spare is free (then none
    is taken), or when no rate is given.
    """
    if spares_free is None or spares_free <= 0:
        return 0.0
    return at_least(spares_free, hard_failures_per_h * hold_s / 3600.0) * replace_s


def at_least(n: int, mean: float) -> float:
    """P(N >= n) for N Poisson with a mean >= 0: 1 - the first n terms, each in log space
    (e^-mean underflows past a mean of about 745). Past mean + 40 sd + 40 the tail is
    below 1e-300, and 0 as a float: so it is not summed (n may be 65,536)."""
    if n > mean + 40.0 * math.sqrt(mean) + 40.0:
        return 0.0
    below = math.fsum(
        math.exp(i * math.log(mean) - mean - math.lgamma(i + 1)) if mean > 0 else float(i == 0)
        for i in range(n)
    )
    return max(0.0, 1.0 - below)


@dataclass(frozen=True, slots=True)
class _Costs:
    """Each option's cost in seconds of the job's time; None: not an option."""

    failover: float | None
    restart: float
    scaled: float | None
    none: float | None
    takes_spare: bool  # the restart takes a spare (spare_usable), and pays its price

    @classmethod
    def of(cls, inp: DecisionInputs, elapsed: float) -> _Costs:
        interval = inp.checkpoint_interval_s
        spare = spare_usable(
            inp.spare_nodes, inp.spares_free, inp.spare_reserve, can_fail_over=inp.path_available
        )
        # Without a spare the restart waits for a node; with one, it leaves a later lost GPU
        # or dead node that wait, as likely as spare_price_s says.
        restart_wait = inp.spare_price_s if spare else inp.node_replace_s
        restart = restart_cost_s(interval, inp.detect_s, inp.reload_s + restart_wait, inp.timeout_s)
        scaled: float | None = None
        if inp.allow_scaling and inp.new_dp_size is not None:
            scaled = restart_scaled_cost_s(
                interval,
                inp.detect_s,
                inp.reload_s,
                inp.timeout_s,
                inp.dp_size,
                new_dp_size=inp.new_dp_size,
            )
        failover: float | None = None
        if inp.path_available:
            failover = failover_cost_s(interval, elapsed, inp.reload_s, inp.timeout_s, inp.k)
        # "none" only costs nothing when the fault healed by itself (a flap the
        # retransmissions rode out); otherwise the collective hangs forever.
        none: float | None = interval - elapsed if inp.healed or not inp.affected else None
        return cls(failover, restart, scaled, none, spare)


def _cheapest(
    inp: DecisionInputs, costs: _Costs, *, elapsed: float, threshold: float
) -> tuple[Action, str]:
    """The action and its reason: nothing to do, no path left, a planned window, or the
    cheaper of failing over and restarting."""
    failover, restart, scaled = costs.failover, costs.restart, costs.scaled
    if costs.none is not None:
        action = Action.NONE
        reason = (
            "the fault healed before the job needed to move; nothing to do"
            if inp.healed
            else "no rank of this job uses the failed port as its primary; "
            "only backup redundancy is reduced"
        )
    elif failover is None:
        action, cost = _cheapest_restart(restart, scaled)
        reason = (
            f"no usable path is left for some GPU (primary and backup both lost); "
            f"{action.value} ({_fmt(cost)}) is the only way forward"
        )
    elif inp.planned:
        action = Action.FAILOVER
        reason = (
            "fail over ahead of it: every GPU keeps a path, so the ranks move to their "
            "backups before the window opens and nothing restarts"
        )
    else:
        restart_action, best_restart = _cheapest_restart(restart, scaled)
        if failover < best_restart:
            action = Action.FAILOVER
            reason = (
                f"fail over: {_fmt(elapsed)} since the last checkpoint is past the "
                f"{_fmt(max(threshold, 0))} threshold at k={inp.k:.3g}: "
                f"failing over costs {_fmt(failover)}, "
                f"{restart_action.value} {_fmt(best_restart)}"
            )
        else:
            action = restart_action
            reason = (
                f"{restart_action.value}: only {_fmt(elapsed)} since the last checkpoint, "
                f"before the {_fmt(threshold)} threshold at k={inp.k:.3g}: "
                f"{restart_action.value} costs {_fmt(best_restart)}, "
                f"failing over {_fmt(failover)}"
            )
    return action, reason


def _cheapest_restart(restart: float, scaled: float | None) -> tuple[Action, float]:
    if scaled is not None and scaled < restart:
        return Action.RESTART_SCALED, scaled
    return Action.RESTART, restart

"""Expected completion time under independent per-link failures: restart vs failover-when-better.

Same model as `scheduler_svc.planning.simulate` (read its docstring): each
link and switch fails independently, a Bernoulli trial per hour that becomes
a Poisson process of rate Λ = links·λ_link + switches·λ_switch per wall hour.
Checkpoints cut the job into intervals that are independent renewals (every
policy leaves an interval with its hardware whole), so the expected completion
time is the sum of the expected wall time of each interval.

restart (closed form)
    An interval of L hours of work restarts on every fault with downtime
    D = T_timeout + T_detect + T_reload, so its expected wall time is
    E = (e^{ΛL} − 1)·(1/Λ + D).
failover when better (ReCCL's rule, k by outstanding-fault count)
    With V_c(s) the expected wall time left in the interval at work s with c
    faults outstanding (k_0 = 1, k_c from ``--k``), running costs k_c wall
    hours per hour of work and faults arrive at μ_c = Λ·k_c per hour of work:
        V_c'(s) = −k_c + μ_c·(V_c(s) − T_timeout − N_c(s)),
    with N_c(s) = V_{c+1}(s) when equation (3) says fail over at s with one
    more fault (s > θ_{c+1}, equation (4)) and T_detect + T_reload + E
    (restart) otherwise; V_0(L) = 0, V_c(L) = T_reload for c ≥ 1 (the clean
    restart at the checkpoint; 0 at the end of the job), and E = V_0(0).
    The system is linear with constant coefficients between the thresholds θ,
    so it is integrated backwards exactly enough (classical Runge-Kutta, step
    ≤ 1/(64·μ)); E enters affinely and is solved for at the end.

Both are exact expectations of the simulator's restart and failover
policies, which is what the tests check the simulator against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scheduler_svc.engine.decision import failover_threshold_s
from scheduler_svc.planning.params import JobModel
from scheduler_svc.planning.simulate import k_by_count

F64 = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class AnalyticRow:
    gpus: int
    expected_faults: float
    restart_hours: float
    failover_hours: float

    @property
    def improvement(self) -> float:
        """Relative reduction of the expected completion time."""
        return 1.0 - self.failover_hours / self.restart_hours


def _intervals(model: JobModel) -> list[tuple[float, int, bool]]:
    """(work per interval, how many, ends the job) for the job's checkpoint intervals."""
    tau, work = model.interval_h, model.hours
    count = work / tau
    whole = math.floor(count + 1e-9)
    rest = work - whole * tau
    if rest <= 1e-9 * tau:
        return [(tau, whole - 1, False), (tau, 1, True)]
    return [(tau, whole, False), (rest, 1, True)]


def restart_interval_h(model: JobModel, rate: F64, length: float) -> F64:
    """(e^{ΛL} − 1)(1/Λ + D), written with expm1 so Λ → 0 gives L."""
    down = model.timeout_h + model.detect_h + model.reload_h
    x = rate * length
    growth = np.expm1(x)
    per_rate = np.where(x > 0, growth / np.where(x > 0, x, 1.0), 1.0) * length
    return np.asarray(per_rate + growth * down, dtype=np.float64)


def failover_interval_h(model: JobModel, rate: F64, length: float, ends_job: bool) -> F64:
    """Expected wall hours of one interval under the ReCCL rule (see the module docstring)."""
    top = len(model.k)
    k = k_by_count(model, top + 1)  # k[c] for c = 0..top+1; top+1 repeats the last entry
    theta = np.array(
        [float(failover_threshold_s(model.interval_h, model.detect_h, float(kc))) for kc in k]
    )
    states = top + 1  # c = 0..top; beyond top the k (and so the rule) no longer changes
    end_value = 0.0 if ends_job else model.reload_h
    # y[c, j, g]: state c, column j (X = 0 or X = 1 in the restart branch), GPU count g.
    y = np.zeros((states, 2, rate.size))
    y[1:, :, :] = end_value
    x_col = np.array([0.0, 1.0])[:, None]
    restart_value = model.detect_h + model.reload_h + x_col  # T_detect + T_reload + E

    def rhs(s: float, v: F64) -> F64:
        out = np.empty_like(v)
        for c in range(states):
            nxt = min(c + 1, top)
            nxt_value = v[nxt] if s > theta[c + 1] else restart_value
            mu = rate * k[c]
            out[c] = -k[c] + mu * (v[c] - model.timeout_h - nxt_value)
        return out

    cuts = sorted({length, 0.0, *(float(t) for t in theta[1:] if 0.0 < t < length)})
    mu_max = float(np.max(rate)) * float(k[-1]) if rate.size else 0.0
    for hi, lo in zip(reversed(cuts[1:]), reversed(cuts[:-1]), strict=True):
        span = hi - lo
        steps = max(16, math.ceil(64.0 * mu_max * span))
        h = -span / steps
        # Evaluate the threshold test just inside the piece so it never flips mid-step.
        inside = lo + 0.5 * span
        for _ in range(steps):
            k1 = rhs(inside, y)
            k2 = rhs(inside, y + 0.5 * h * k1)
            k3 = rhs(inside, y + 0.5 * h * k2)
            k4 = rhs(inside, y + h * k3)
            y = y + (h / 6.0) * (k1 + 2 * k2 + 2 * k3 + k4)
    a = y[0, 0]
    b = y[0, 1] - a
    return np.asarray(a / (1.0 - b), dtype=np.float64)


def expected_hours(models: Sequence[JobModel]) -> list[AnalyticRow]:
    """Expected completion time under restart and under failover, one row per job model."""
    if not models:
        return []
    first = models[0]
    rate = np.array([m.fault_rate_per_h for m in models])
    restart = np.zeros(rate.size)
    failover = np.zeros(rate.size)
    for length, count, ends_job in _intervals(first):
        if count == 0:
            continue
        restart += count * restart_interval_h(first, rate, length)
        failover += count * failover_interval_h(first, rate, length, ends_job)
    return [
        AnalyticRow(
            gpus=m.gpus,
            expected_faults=m.fault_rate_per_h * m.hours,
            restart_hours=float(restart[i]),
            failover_hours=float(failover[i]),
        )
        for i, m in enumerate(models)
    ]

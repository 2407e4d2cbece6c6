"""The planning parameters fitted from the fleet's history (`--history FILE`), pure.

Rates are per component-hour: faults of a kind over the hours its components were
registered in the window (a node counts from its first registration), with an exact
95 % Poisson interval. Components and what counts:

- link: a port down (link_down) that stayed down at least FLAP_S, or is still down,
  and was not part of an inferred switch failure; per RNIC port-hour;
- flap: a port down that was back within FLAP_S; per port-hour;
- rnic: an RNIC's fatal error or its loss from the registration; per RNIC-hour;
- cqe: a burst of retry-exceeded completions with no port change; per port-hour;
- gpu: a GPU lost; per GPU-hour;
- switch: a switch failure the service inferred; per switch-hour (a switch counts
  from the first registration of a node cabled to it).

`railover simulate` has one link rate: link and RNIC faults per link-hour (an RNIC's
death cuts its links as a cable's does). The repair time is the mean time to clear of
the closed link, RNIC and switch faults (faults still open are left out, so it reads
low when repairs outlast the window). The job mix is the median over jobs of the size,
checkpoint interval, reload, detection and timeout; k is the median measured k, or,
where no job has one, the median k the fleet manager declared.

A figure with no observation (no fault of a kind, no closed fault, no job) is not
invented: it is listed in `missing`, and the command refuses unless its flag gives it
or `--fill-defaults` takes the default.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduler_svc.planning.history import History
from scheduler_svc.planning.params import HOURS_PER_MONTH, JobModel

Z95 = 1.959963984540054
FLAP_S = 60.0  # a port back up within this was a flap, not a broken link
RATE_KINDS = ("link", "flap", "rnic", "cqe", "gpu", "switch")
UNIT = {
    "link": "port-h",
    "flap": "port-h",
    "rnic": "RNIC-h",
    "cqe": "port-h",
    "gpu": "GPU-h",
    "switch": "switch-h",
}


@dataclass(frozen=True, slots=True)
class Rate:
    kind: str
    events: int
    exposure_h: float  # component-hours
    per_h: float
    low: float  # 95 % interval of per_h
    high: float

    def as_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "exposure_h": self.exposure_h,
            "unit": UNIT.get(self.kind, "h"),
            "per_h": self.per_h,
            "ci95": [self.low, self.high],
        }


@dataclass(frozen=True, slots=True)
class Figure:
    """One planning parameter: its value, what it rests on, and where it came from."""

    key: str  # JobModel's field
    value: Any
    observations: int
    what: str  # "12 closed faults", "3 jobs"
    interval: tuple[float, float] | None = None
    source: str = "history"  # or "default", "flag"


@dataclass
class Fit:
    rates: dict[str, Rate]
    figures: dict[str, Figure]
    missing: dict[str, str] = field(default_factory=dict)  # key -> why it lacks data
    nodes: int = 0
    jobs: int = 0
    hours: float = 0.0

    def values(self) -> dict[str, object]:
        return {k: f.value for k, f in self.figures.items() if f.source == "history"}

    def as_json(self) -> dict[str, Any]:
        return {
            "window_h": self.hours,
            "nodes": self.nodes,
            "jobs": self.jobs,
            "flap_s": FLAP_S,
            "rates": {k: r.as_json() for k, r in self.rates.items()},
            "parameters": {
                k: {
                    "value": list(f.value) if isinstance(f.value, tuple) else f.value,
                    "observations": f.observations,
                    "rests_on": f.what,
                    "ci95": list(f.interval) if f.interval else None,
                    "source": f.source,
                }
                for k, f in self.figures.items()
            },
            "missing": self.missing,
        }


def poisson_interval(n: int, exposure: float) -> tuple[float, float]:
    """Exact (Garwood) 95 % interval of a rate from `n` events over `exposure`."""
    if exposure <= 0:
        return 0.0, math.inf
    if n > 1000:  # Wilson-Hilferty: within 0.1 % of the exact bounds here, and O(1)
        low = n * (1 - 1 / (9 * n) - Z95 / (3 * math.sqrt(n))) ** 3
        high = (n + 1) * (1 - 1 / (9 * (n + 1)) + Z95 / (3 * math.sqrt(n + 1))) ** 3
        return low / exposure, high / exposure
    low = 0.0 if n == 0 else _mean_with_cdf(n - 1, 0.975)
    return low / exposure, _mean_with_cdf(n, 0.025) / exposure


def _mean_with_cdf(n: int, p: float) -> float:
    """The Poisson mean μ at which P(X <= n) = p (decreasing in μ): bisection."""
    lo, hi = 0.0, max(10.0, 2.0 * n + 20.0 * math.sqrt(n + 1.0))
    for _ in range(200):
        mid = (lo + hi) / 2
        if _cdf(n, mid) > p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _cdf(n: int, mu: float) -> float:
    if mu <= 0:
        return 1.0
    log_term = -mu  # k = 0
    total = math.exp(log_term)
    for k in range(1, n + 1):
        log_term += math.log(mu) - math.log(k)
        total += math.exp(log_term)
    return min(total, 1.0)


def monthly_fraction(per_h: float) -> float:
    """The monthly failure probability whose hourly hazard is `per_h` (params.hourly_hazard
    inverted)."""
    return -math.expm1(-per_h * HOURS_PER_MONTH)


def _hours(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds() / 3600.0)


def exposure(history: History) -> dict[str, float]:
    """Component-hours per rate kind over the window."""
    since, until = history.window.since, history.window.until
    out = dict.fromkeys(RATE_KINDS, 0.0)
    first_on: dict[str, datetime] = {}
    for node in history.nodes:
        h = _hours(max(since, node.registered_at), until)
        out["link"] += node.ports * h
        out["rnic"] += node.rnics * h
        out["gpu"] += node.gpus * h
        for s in node.switches:
            first_on[s] = min(first_on.get(s, node.registered_at), node.registered_at)
    out["flap"] = out["cqe"] = out["link"]
    out["switch"] = sum(_hours(max(since, at), until) for at in first_on.values())
    return out


def counts(history: History) -> Counter[str]:
    """Faults per rate kind (see the module's list)."""
    n: Counter[str] = Counter()
    for f in history.faults:
        if f.component == "link":
            if f.switch_fault_id is not None:
                continue  # the switch's failure, counted once below
            short = f.duration_s is not None and f.duration_s < FLAP_S
            n["flap" if short else "link"] += 1
        elif f.component in ("rnic", "cqe", "gpu"):
            n[f.component] += 1
    n["switch"] = len(history.switch_faults)
    return n


def fit(history: History) -> Fit:
    hours = _hours(history.window.since, history.window.until)
    exp, n = exposure(history), counts(history)
    rates = {}
    for kind in RATE_KINDS:
        e = exp[kind]
        low, high = poisson_interval(n[kind], e)
        rates[kind] = Rate(kind, n[kind], e, n[kind] / e if e > 0 else 0.0, low, high)
    result = Fit(rates, {}, nodes=len(history.nodes), jobs=len(history.jobs), hours=hours)
    _fit_rates(result, exp, n)
    _fit_repair(result, history)
    _fit_jobs(result, history)
    _fit_layout(result, history)
    return result


def _fit_rates(out: Fit, exp: dict[str, float], n: Counter[str]) -> None:
    _fit_rate(
        out,
        "link_failure_monthly",
        n["link"] + n["rnic"],
        exp["link"],
        no_exposure="the history has no node with an RNIC port",
        what=("link and RNIC faults", "no link or RNIC fault"),
        unit="port",
    )
    _fit_rate(
        out,
        "switch_failure_monthly",
        n["switch"],
        exp["switch"],
        no_exposure="no node names the switch its ports are cabled to",
        what=("switch failures", "no switch failure"),
        unit="switch",
    )


def _fit_rate(
    out: Fit,
    key: str,
    count: int,
    hours: float,
    *,
    no_exposure: str,
    what: tuple[str, str],
    unit: str,
) -> None:
    """One monthly rate, `count` events over `hours` of exposure, with its 95 % Poisson
    interval; refused (`out.missing`) with no exposure or no event."""
    if hours <= 0:
        out.missing[key] = no_exposure
    elif count == 0:
        high = poisson_interval(0, hours)[1]
        out.missing[key] = (
            f"{what[1]} in {hours:,.0f} {unit}-hours (the rate is below "
            f"{monthly_fraction(high):.3g} a month, 95 %): too few to fit"
        )
    else:
        low, high = poisson_interval(count, hours)
        out.figures[key] = Figure(
            key,
            monthly_fraction(count / hours),
            count,
            f"{count} {what[0]} in {hours:,.0f} {unit}-h",
            (monthly_fraction(low), monthly_fraction(high)),
        )


def _fit_repair(out: Fit, history: History) -> None:
    closed = [
        f.duration_s
        for f in history.faults
        if f.component in ("link", "rnic")
        and f.switch_fault_id is None
        and f.duration_s is not None
        and f.duration_s >= FLAP_S
    ]
    closed += [s.duration_s for s in history.switch_faults if s.duration_s is not None]
    if not closed:
        out.missing["repair_h"] = "no link, RNIC or switch fault was repaired in the window"
        return
    out.figures["repair_h"] = Figure(
        "repair_h", statistics.fmean(closed) / 3600, len(closed), f"{len(closed)} repaired faults"
    )


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _fit_jobs(out: Fit, history: History) -> None:
    jobs = [j for j in history.jobs if j.ranks > 0 and j.nodes > 0]
    if not jobs:
        for key in ("gpus", "checkpoint_interval_h", "reload_h", "detect_h", "timeout_s", "k"):
            out.missing[key] = "the history has no job with ranks"
        return
    what = f"{len(jobs)} jobs"

    def put(key: str, value: object, n: int = len(jobs), about: str = what) -> None:
        out.figures[key] = Figure(key, value, n, about)

    per_node = round(_median([j.ranks / j.nodes for j in jobs]))
    gpus = max(per_node, per_node * round(_median([j.ranks for j in jobs]) / per_node))
    put("gpus_per_node", per_node)
    put("gpus", gpus)
    flowcheck = [j for j in jobs if j.checkpoint_kind == "flowcheck"]
    if len(flowcheck) * 2 > len(jobs):
        put("checkpoint", "flowcheck", len(flowcheck), f"{len(flowcheck)} of {what} FlowCheck")
        put("iteration_s", _median([j.checkpoint_interval_s for j in flowcheck]), len(flowcheck))
    else:
        periodic = [j for j in jobs if j.checkpoint_kind != "flowcheck"]
        put("checkpoint", "interval", len(periodic), f"{len(periodic)} of {what} periodic")
        interval = _median([j.checkpoint_interval_s for j in periodic]) / 3600
        put("checkpoint_interval_h", interval, len(periodic))
    put("reload_h", _median([j.reload_s for j in jobs]) / 3600)
    put("detect_h", _median([j.detect_s for j in jobs]) / 3600)
    put("timeout_s", _median([j.timeout_s for j in jobs]))
    measured = [j.measured_k for j in jobs if j.measured_k is not None]
    declared = [j.declared_k for j in jobs if j.declared_k is not None]
    ks, about = (measured, "measured") if measured else (declared, "declared")
    if not ks:
        out.missing["k"] = "no job measured or declared its slowdown k"
    else:
        k = max(1.0, _median(ks))
        rest = JobModel().k[1:]
        put("k", (k, *(max(k, v) for v in rest)), len(ks), f"{len(ks)} jobs' {about} k")
    dps = [j.dp_size for j in jobs if j.dp_size >= 2]
    if dps:
        put("dp", round(_median([float(d) for d in dps])), len(dps), f"{len(dps)} jobs' DP")


def _fit_layout(out: Fit, history: History) -> None:
    per_switch: Counter[str] = Counter()
    for node in history.nodes:
        per_switch.update(set(node.switches))
    if per_switch:
        n = round(_median([float(v) for v in per_switch.values()]))
        out.figures["nodes_per_switch"] = Figure(
            "nodes_per_switch", n, len(per_switch), f"{len(per_switch)} switches"
        )

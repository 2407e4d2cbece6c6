"""The fleet twin on a fleet's own history (`railover twin --history FILE`): the planning
parameters fitted from a `railover export` (planning.fit), and the rate of each kind the
twin breaks that the history has seen.

LINK, FLAP, RNIC, CQE, GPU and LEAF take the history's rate per component-hour; a kind
with no fault in the history is refused unless `--fill-defaults` (then the twin's model:
a multiple of the link rate, cluster.KIND_SCALE). PARTITION and NODE are never in a
history (the service hears nothing while a node is cut off or dead) and always follow
the model.

The jobs are the history's own, newest first, each with its size, checkpoint regime,
reload, detection, timeout and k (measured, else declared, else the fitted one): the
twin runs as many of them side by side as fit (cluster.job_mix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scheduler_svc.planning.cli_history import fitted
from scheduler_svc.planning.fit import UNIT, Fit
from scheduler_svc.planning.history import History, load_history
from scheduler_svc.planning.params import JobModel, ParamError
from scheduler_svc.twin.cluster import FaultKind, JobShape

# The twin's kind each fitted rate drives.
FROM_HISTORY = {
    "link": FaultKind.LINK,
    "flap": FaultKind.FLAP,
    "rnic": FaultKind.RNIC,
    "cqe": FaultKind.CQE,
    "gpu": FaultKind.GPU,
    "switch": FaultKind.LEAF,
}


@dataclass(frozen=True, slots=True)
class TwinFit:
    model: JobModel
    per_component_h: dict[FaultKind, float]
    fit: Fit
    modelled: tuple[str, ...]  # the kinds that follow the model, not the history
    nodes: int
    shapes: tuple[JobShape, ...]  # the history's jobs, newest first
    nodes_per_leaf: int | None


def twin_fit(path: Path, *, fill_defaults: bool) -> TwinFit:
    history = load_history(path)
    values, result = fitted(
        path, fill_defaults=fill_defaults, given=set(), flags=False, history=history
    )
    model = JobModel(**values)  # type: ignore[arg-type]  # JobModel's fields, typed by the fit
    rates: dict[FaultKind, float] = {}
    modelled = [FaultKind.PARTITION.value, FaultKind.NODE.value]
    for name, kind in FROM_HISTORY.items():
        rate = result.rates[name]
        if rate.events > 0:
            rates[kind] = rate.per_h
        elif fill_defaults:
            modelled.append(kind.value)
        else:
            raise ParamError(
                "history",
                f"no {name} fault in {rate.exposure_h:,.0f} {UNIT[name]} ({path}): too few to "
                f"fit the twin's {kind.value} rate; give a longer history, or --fill-defaults "
                "for the twin's model (a multiple of the link rate)",
            )
    per_switch = result.figures.get("nodes_per_switch")
    return TwinFit(
        model=model,
        per_component_h=rates,
        fit=result,
        modelled=tuple(modelled),
        nodes=result.nodes,
        shapes=shapes_of(history, model),
        nodes_per_leaf=int(per_switch.value) if per_switch is not None else None,
    )


def shapes_of(history: History, model: JobModel) -> tuple[JobShape, ...]:
    """The history's jobs with ranks, newest first, on whole nodes of the twin's 8 GPUs."""
    jobs = sorted(
        (j for j in history.jobs if j.ranks > 0 and j.nodes > 0),
        key=lambda j: j.created_at,
        reverse=True,
    )
    return tuple(
        JobShape(
            nodes=j.nodes,
            checkpoint="flowcheck" if j.checkpoint_kind == "flowcheck" else "interval",
            interval_s=j.checkpoint_interval_s,
            reload_s=j.reload_s,
            detect_s=j.detect_s,
            timeout_s=j.timeout_s,
            k=max(1.0, j.measured_k or j.declared_k or model.k[0]),
        )
        for j in jobs
    )

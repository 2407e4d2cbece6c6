"""The fleet twin on a fleet's own history (`railover twin --history FILE`): the planning
parameters fitted from a `railover export` (planning.fit), and the rate of each kind the
twin breaks that the history has seen.

LINK, FLAP, RNIC, CQE, GPU and LEAF take the history's rate per component-hour; a kind
with no fault in the history is refused unless `--fill-defaults` (then the twin's model:
a multiple of the link rate, cluster.KIND_SCALE). PARTITION and NODE are never in a
history (the service hears nothing while a node is cut off or dead) and always follow
the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scheduler_svc.planning.cli_history import fitted
from scheduler_svc.planning.fit import UNIT, Fit
from scheduler_svc.planning.params import JobModel, ParamError
from scheduler_svc.twin.cluster import FaultKind

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
    jobs: int
    nodes_per_leaf: int | None


def twin_fit(path: Path, *, fill_defaults: bool) -> TwinFit:
    values, result = fitted(path, fill_defaults=fill_defaults, given=set(), flags=False)
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
        jobs=result.jobs,
        nodes_per_leaf=int(per_switch.value) if per_switch is not None else None,
    )

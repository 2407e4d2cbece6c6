"""`--history FILE` and `--fill-defaults` of `railover simulate` and `railover twin`: the
parameters fitted from a `railover export` (planning.fit), what each rests on, and the
refusal of a figure the history cannot give."""

from __future__ import annotations

from collections.abc import Mapping, Set
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from scheduler_svc.planning.fit import UNIT, Figure, Fit, fit
from scheduler_svc.planning.history import History, load_history
from scheduler_svc.planning.params import JobModel, ParamError, flag_of

HistoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="A `railover export` of the fleet: fit the fault rates (per component-hour), "
        "repair time and job mix from it, print them with what each rests on, then answer "
        "with them. A figure the history lacks is refused unless its flag gives it or "
        "--fill-defaults.",
    ),
]
FillDefaults = Annotated[
    bool,
    typer.Option(
        "--fill-defaults",
        help="With --history: take the default for each figure the history has no data "
        "for, instead of refusing.",
    ),
]


def fitted(
    path: Path,
    *,
    fill_defaults: bool,
    given: Set[str],
    flags: bool = True,
    history: History | None = None,
) -> tuple[dict[str, object], Fit]:
    """The JobModel values fitted from the export at `path` (before --config and flags,
    which win: `given` names the keys they set) and the fit itself. A figure with no data
    that nothing gives raises ParamError naming it, unless `fill_defaults`; `flags`: the
    command has a flag per figure (else the error is about --history, naming the figure).
    `history`: the export, where the caller has read it already."""
    result = fit(history if history is not None else load_history(path))
    defaults = JobModel()
    for key, why in result.missing.items():
        if key in given:
            continue
        if not fill_defaults and flags:
            raise ParamError(
                key,
                f"{why} ({path}); give {flag_of(key)}, a longer history, or --fill-defaults "
                "to take the default",
            )
        if not fill_defaults:
            raise ParamError(
                "history",
                f"{key}: {why} ({path}); give a longer history, or --fill-defaults to take "
                "the default",
            )
        result.figures[key] = Figure(key, getattr(defaults, key), 0, why, source="default")
    for key in given:
        if key in result.figures:
            old = result.figures[key]
            result.figures[key] = Figure(key, old.value, 0, old.what, source="overridden")
    return result.values(), result


def given_keys(config: Mapping[str, object], flags: Mapping[str, object | None]) -> set[str]:
    return {k.replace("-", "_") for k in config} | {k for k, v in flags.items() if v is not None}


def fit_tables(result: Fit) -> list[Table]:
    rates = Table(
        title=f"Fault rates fitted from the history ({result.nodes} nodes, {result.hours:,.1f} h)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for head in ("kind", "faults", "exposure", "per component-hour", "95 % interval"):
        rates.add_column(head, justify="left" if head == "kind" else "right")
    for kind, r in result.rates.items():
        rates.add_row(
            kind,
            str(r.events),
            f"{r.exposure_h:,.0f} {UNIT[kind]}",
            f"{r.per_h:.3g}",
            f"{r.low:.3g} – {r.high:.3g}",
        )
    params = Table(title="Fitted parameters", title_justify="left", box=box.SIMPLE_HEAD)
    for head in ("parameter", "value", "observations", "rests on", "95 % interval", "source"):
        params.add_column(head, justify="right" if head in ("observations",) else "left")
    for key, f in result.figures.items():
        params.add_row(
            key,
            _fmt(f.value),
            str(f.observations),
            f.what,
            f"{f.interval[0]:.3g} – {f.interval[1]:.3g}" if f.interval else "",
            f.source,
        )
    return [rates, params]


def print_fit(console: Console, result: Fit) -> None:
    for t in fit_tables(result):
        console.print(t)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, tuple):
        return ",".join(_fmt(v) for v in value)
    return str(value)

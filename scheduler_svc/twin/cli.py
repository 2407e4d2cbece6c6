"""`railover twin`: the fleet twin from the command line; each policy on the same seeded
traces, a table of GPU-hours lost (mean and 95 % interval over seeds), decisions per
fault and invariant violations, and the same as JSON."""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from scheduler_svc.engine.decision import Policy
from scheduler_svc.planning.cli_history import FillDefaults, HistoryOpt, print_fit
from scheduler_svc.planning.cli_options import param_errors
from scheduler_svc.planning.cli_simulate import check_plot_path
from scheduler_svc.twin.books import CAUSES, Curve, TwinResult
from scheduler_svc.twin.cluster import ClusterSpec, Reports, job_mix
from scheduler_svc.twin.fitted import TwinFit, twin_fit

HELP = (
    "Run the real service in closed loop with a simulated cluster, on a manual clock: "
    "faults from the planning parameters (times --fault-scale), agents, ranks and a fleet "
    "manager doing what the service says; GPU-hours lost per policy and the invariants. "
    "--history FILE (a `railover export`) fits the rates, repair time and job mix from the "
    "fleet's own history first and prints them; --plot draws the loss over time."
)


def register(app: typer.Typer) -> None:
    app.command("twin", help=HELP)(twin_command)


def twin_command(  # noqa: PLR0917  # one parameter per option
    nodes: Annotated[
        int | None,
        typer.Option(min=2, help="GPU nodes (8 GPUs, 8 RNICs each) [256; the history's]"),
    ] = None,
    spares: Annotated[int, typer.Option(min=0, help="Of them, spares kept free")] = 8,
    nodes_per_leaf: Annotated[
        int | None, typer.Option(min=1, help="Nodes per leaf, per rail [32; the history's]")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(min=1, help="Jobs sharing the other nodes [2; the history's]")
    ] = None,
    days: Annotated[float, typer.Option(min=0.001, help="Simulated days")] = 7.0,
    seed: Annotated[int, typer.Option(min=0, help="The first seed")] = 1,
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per policy (for the interval)")] = 1,
    fault_scale: Annotated[float, typer.Option(min=0, help="Multiplies every fault rate")] = 1.0,
    delay_p: Annotated[
        float, typer.Option(min=0, max=1, help="Share of reports held back (up to --max-delay-s)")
    ] = 0.0,
    duplicate_p: Annotated[
        float, typer.Option(min=0, max=1, help="Share of reports sent a second time")
    ] = 0.0,
    max_delay_s: Annotated[
        float, typer.Option(min=0, max=86400, help="Longest hold-back or resend, seconds")
    ] = 30.0,
    skew_s: Annotated[
        float, typer.Option(min=0, max=86400, help="Node clocks off by up to this, seconds")
    ] = 0.0,
    policy: Annotated[
        list[Policy] | None, typer.Option(help="A policy to run (repeat it); default: all four")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write every run's books here")
    ] = None,
    history: HistoryOpt = None,
    fill_defaults: FillDefaults = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Draw GPU-hours lost over simulated time per policy (the mean over seeds) "
            "to this file, .png, .svg or .pdf (needs matplotlib: the plot extra)."
        ),
    ] = None,
    allow_scaling: Annotated[
        bool,
        typer.Option(
            "--allow-scaling",
            help="Jobs may restart without a broken node (a DP replica per node, the "
            "service's restart_scaled) when no spare is free, and grow back at a "
            "checkpoint once one is",
        ),
    ] = False,
    spare_reserve: Annotated[
        int,
        typer.Option(
            min=0,
            max=65536,
            help="The service's RAILOVER_SPARE_RESERVE: spares it keeps for lost GPUs and "
            "dead nodes, restarting for a fault it could fail over from only while more "
            "are free",
        ),
    ] = 0,
    price_spares: Annotated[
        bool,
        typer.Option(
            "--price-spares",
            help="Run the service with RAILOVER_HARD_FAILURES_PER_H at the trace's rate of "
            "lost GPUs and dead nodes: a restart that takes a spare pays the wait it may "
            "leave one of them",
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            min=0,
            help="Runs side by side, each in a process of its own; 0: one per run, up to the CPUs",
        ),
    ] = 0,
) -> None:
    logging.getLogger("scheduler_svc").setLevel(logging.ERROR)
    logging.getLogger("railover").setLevel(logging.ERROR)
    if plot is not None:
        check_plot_path(plot)  # before the runs, which take minutes
    fitted: TwinFit | None = None
    if history is not None:
        with param_errors("twin"):
            fitted = twin_fit(history, fill_defaults=fill_defaults)
        nodes = nodes or max(2, fitted.nodes)
        jobs = jobs or max(1, min(len(fitted.shapes), nodes - spares))
        nodes_per_leaf = nodes_per_leaf or fitted.nodes_per_leaf
    nodes, jobs, nodes_per_leaf = nodes or 256, jobs or 2, nodes_per_leaf or 32
    try:
        spec = ClusterSpec(
            nodes=nodes,
            spares=spares,
            nodes_per_leaf=nodes_per_leaf,
            jobs=jobs,
            scaling=allow_scaling,
        )
        reports = Reports(
            delay_p=delay_p, duplicate_p=duplicate_p, max_delay_s=max_delay_s, skew_s=skew_s
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    policies = policy or list(Policy)
    console = Console(stderr=True)
    out = Console(width=max(Console().width, 180))
    if fitted is not None:
        print_fit(out, fitted.fit)
        out.print(
            "the twin's rates per component-hour from the history: "
            + ", ".join(f"{k.value} {v:.3g}" for k, v in fitted.per_component_h.items())
            + f"; from its model (a multiple of the link rate): {', '.join(fitted.modelled)}"
        )
        laid = job_mix(spec, fitted.model, fitted.shapes)
        out.print(
            f"the history's jobs the twin runs (newest first, as many as fit on "
            f"{nodes - spares} non-spare nodes): {len(laid)} of {len(fitted.shapes)}: "
            + "; ".join(
                f"{len(j.nodes)} nodes, {j.checkpoint} {j.interval_s:g} s, reload "
                f"{j.reload_s:g} s, k {j.k:g}"
                for j in laid
            )
        )
    # The service (FastAPI, SQLAlchemy, the app) loads for a run, not for every `railover`.
    from scheduler_svc.twin.runs import Run, default_workers, hard_rate, run_all  # noqa: PLC0415

    runs = [
        Run(
            spec, days, s, fault_scale, p, reports,
            model=fitted.model if fitted is not None else None,
            per_component_h=fitted.per_component_h if fitted is not None else None,
            shapes=fitted.shapes if fitted is not None else (),
            spare_reserve=spare_reserve,
            price_spares=price_spares,
            curve=plot is not None,
        )
        for p in policies
        for s in range(seed, seed + seeds)
    ]  # fmt: skip
    if price_spares:
        out.print(
            f"spares priced by {hard_rate(runs[0]):.4g} lost GPUs and dead nodes an hour "
            "(the trace's rate, as RAILOVER_HARD_FAILURES_PER_H)"
        )
    with Progress(console=console, transient=True) as bar:
        tasks = [bar.add_task(f"{u.policy.value}, seed {u.seed}", total=1.0) for u in runs]
        done = run_all(
            runs,
            workers=workers or default_workers(len(runs)),
            progress=lambda i, f: bar.update(tasks[i], completed=f),
        )
    results = [d.result for d in done]
    curves: dict[str, list[Curve]] = {}
    for run, d in zip(runs, done, strict=True):
        if d.curve is not None:
            curves.setdefault(run.policy.value, []).append(d.curve)
    out.print(table(results))
    if plot is not None:
        from scheduler_svc.twin.plot import plot_loss, title_of  # noqa: PLC0415  # matplotlib

        origin = ", rates from the history" if fitted is not None else ""
        plot_loss(curves, plot, title_of(nodes, days, fault_scale, seeds, origin))
        out.print(f"Plot written to {plot}.")
    sent = Counter[str]()
    for r in results[: len(results) // len(policies)]:  # the first policy's runs: one per trace
        sent.update(r.reports)
    out.print(
        "reports per trace: "
        + ", ".join(f"{sent[k]} {k}" for k in ("late", "twice", "held", "overtaken"))
        + " (late: held back; twice: sent again; held: by a cut-off agent; overtaken: "
        "reached the service after a newer report of the same port)"
    )
    if json_out is not None:
        json_out.write_text(json.dumps([r.as_json() for r in results], indent=2) + "\n")
    broken = sum(sum(r.violations.values()) for r in results)
    for r in results:
        for name, first in r.first_violation.items():
            console.print(f"[red]{r.policy} seed {r.seed}: {name}[/red]: {first}")
    sys.exit(1 if broken else 0)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95 % interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, 1.96 * statistics.stdev(values) / math.sqrt(len(values))


def summary(results: Sequence[TwinResult]) -> list[dict[str, Any]]:
    """One row per policy: GPU-hours lost (mean, 95 % interval) in all and by cause,
    decisions per fault, violations, and the simulated-to-wall ratio."""
    rows = []
    for p in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == p]
        total, ci = mean_ci([r.gpu_hours_total for r in mine])
        faults = sum(sum(r.faults.values()) for r in mine)
        decided = sum(sum(r.decisions.values()) for r in mine)
        wall = sum(r.wall_s for r in mine)
        rows.append(
            {
                "policy": p,
                "seeds": len(mine),
                "gpu_hours_lost": total,
                "ci95": ci,
                "by_cause": {
                    c: statistics.fmean(r.gpu_hours_lost[c] for r in mine) for c in CAUSES
                },
                "share_lost": total / statistics.fmean(r.gpu_hours for r in mine),
                "faults": faults / len(mine),
                "decisions_per_fault": decided / faults if faults else 0.0,
                "violations": sum(sum(r.violations.values()) for r in mine),
                "sim_per_wall": sum(r.days * 86400 for r in mine) / wall if wall else 0.0,
            }
        )
    return rows


def table(results: Sequence[TwinResult]) -> Table:
    t = Table(title="GPU-hours lost per policy (the same traces)")
    for name in ("policy", "lost GPU-h", "±95 %", "% of GPU-h", *CAUSES, "faults",
                 "decisions/fault", "violations", "sim/wall"):  # fmt: skip
        # The columns keep their width: a narrow terminal wraps the table, not the numbers.
        t.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for row in summary(results):
        t.add_row(
            row["policy"],
            f"{row['gpu_hours_lost']:,.1f}",
            f"{row['ci95']:,.1f}",
            f"{100 * row['share_lost']:.2f}",
            *(f"{row['by_cause'][c]:,.1f}" for c in CAUSES),
            f"{row['faults']:.0f}",
            f"{row['decisions_per_fault']:.2f}",
            str(row["violations"]),
            f"{row['sim_per_wall']:,.0f}x",
        )
    return t

"""`railover analytic`: the closed-form expected cost of each policy, printed."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from scheduler_svc.planning import analytic as analytic_model
from scheduler_svc.planning import simulate as sim
from scheduler_svc.planning.cli_options import (
    Checkpoint,
    Config,
    DetectH,
    GpusPerNode,
    Hours,
    IntervalH,
    IterationS,
    JsonOut,
    KList,
    LinkMonthly,
    NodesPerSwitch,
    ReloadH,
    Seed,
    Switches,
    SwitchMonthly,
    TimeoutS,
    param_errors,
    print_parameters,
)
from scheduler_svc.planning.params import (
    analytic_params,
)


def analytic_command(  # noqa: PLR0917  # one parameter per option; click passes them by name
    gpus: Annotated[
        str | None, typer.Option(help="GPU counts, comma list. [1024,4096,16384,65536]")
    ] = None,
    gpus_per_node: GpusPerNode = None,
    hours: Hours = None,
    link_failure_monthly: LinkMonthly = None,
    switch_failure_monthly: SwitchMonthly = None,
    switches: Switches = None,
    nodes_per_switch: NodesPerSwitch = None,
    checkpoint: Checkpoint = None,
    checkpoint_interval_h: IntervalH = None,
    iteration_s: IterationS = None,
    detect_h: DetectH = None,
    reload_h: ReloadH = None,
    timeout_s: TimeoutS = None,
    k: KList = None,
    runs: Annotated[
        int | None,
        typer.Option(help="If > 0, also simulate this many runs per GPU count as a check. [0]"),
    ] = None,
    seed: Seed = None,
    json_out: JsonOut = False,
    config: Config = None,
) -> None:
    flags: dict[str, object | None] = {
        "gpus": gpus,
        "gpus_per_node": gpus_per_node,
        "hours": hours,
        "link_failure_monthly": link_failure_monthly,
        "switch_failure_monthly": switch_failure_monthly,
        "switches": switches,
        "nodes_per_switch": nodes_per_switch,
        "checkpoint": checkpoint,
        "checkpoint_interval_h": checkpoint_interval_h,
        "iteration_s": iteration_s,
        "detect_h": detect_h,
        "reload_h": reload_h,
        "timeout_s": timeout_s,
        "k": k,
        "runs": runs,
        "seed": seed,
    }
    with param_errors("analytic"):
        models, n_runs, n_seed = analytic_params(config, flags)
    rows = analytic_model.expected_hours(models)
    hours_ff = models[0].hours
    params = models[0].describe()
    params.pop("derived")
    params["gpus"] = [m.gpus for m in models]
    params["runs"] = n_runs
    params["seed"] = n_seed
    document: dict[str, Any] = {
        "parameters": params,
        "results": [_analytic_row(row, hours_ff) for row in rows],
    }
    checks: list[dict[str, float]] = []
    if n_runs > 0:
        for model in models:
            res = sim.simulate(model, n_runs, n_seed, policies=("restart", "failover"))
            checks.append(
                {
                    "gpus": model.gpus,
                    "restart_hours": res.stats["restart"].mean_gpu_hours / model.gpus,
                    "restart_ci95": res.stats["restart"].ci95_gpu_hours / model.gpus,
                    "failover_hours": res.stats["failover"].mean_gpu_hours / model.gpus,
                    "failover_ci95": res.stats["failover"].ci95_gpu_hours / model.gpus,
                }
            )
        document["simulated"] = checks
    if json_out:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = Console()
    print_parameters(console, params, "Parameters")
    table = Table(
        title="Expected completion time (h): restart vs failover when better",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for head in (
        "GPUs",
        "faults",
        "restart",
        "failover",
        "restart extra",
        "failover extra",
        "time saved",
        "extra saved",
    ):
        table.add_column(head, justify="right")
    for doc in document["results"]:
        saved = doc["extra_saved"]
        cells = [
            f"{doc['gpus']:,}",
            f"{doc['expected_faults']:.1f}",
            f"{doc['restart_hours']:.2f}",
            f"{doc['failover_hours']:.2f}",
            f"{doc['restart_extra_hours']:.2f}",
            f"{doc['failover_extra_hours']:.2f}",
            f"{doc['improvement']:.2%}",
            f"{saved:.1%}" if saved is not None else "—",
        ]
        table.add_row(*cells)
    console.print(table)
    if checks:
        check = Table(
            title=f"Monte Carlo check, {n_runs:,} runs (mean ± 95 % CI, h)",
            title_justify="left",
            box=box.SIMPLE_HEAD,
        )
        for head in ("GPUs", "restart", "simulated", "failover", "simulated"):
            check.add_column(head, justify="right")
        for row, c in zip(rows, checks, strict=True):
            check.add_row(
                f"{row.gpus:,}",
                f"{row.restart_hours:.2f}",
                f"{c['restart_hours']:.2f} ± {c['restart_ci95']:.2f}",
                f"{row.failover_hours:.2f}",
                f"{c['failover_hours']:.2f} ± {c['failover_ci95']:.2f}",
            )
        console.print(check)


def _analytic_row(row: analytic_model.AnalyticRow, hours_ff: float) -> dict[str, Any]:
    """Every number of one table row: `improvement` is "time saved", `extra_saved` the
    share of the extra hours (above the fault-free job) that failover saves."""
    extra_r, extra_f = row.restart_hours - hours_ff, row.failover_hours - hours_ff
    return {
        "gpus": row.gpus,
        "expected_faults": row.expected_faults,
        "restart_hours": row.restart_hours,
        "failover_hours": row.failover_hours,
        "restart_extra_hours": extra_r,
        "failover_extra_hours": extra_f,
        "improvement": row.improvement,
        "extra_saved": 1 - extra_f / extra_r if extra_r > 0 else None,
    }

"""`railover simulate`: the Monte Carlo comparison of the policies over a job's life, printed."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scheduler_svc.errors import refuse
from scheduler_svc.planning import simulate as sim
from scheduler_svc.planning.cli_history import (
    FillDefaults,
    HistoryOpt,
    fitted,
    given_keys,
    print_fit,
)
from scheduler_svc.planning.cli_options import (
    DEFAULTS,
    Checkpoint,
    Config,
    DetectH,
    Dp,
    GpusPerNode,
    Hours,
    IntervalH,
    IterationS,
    JsonOut,
    KList,
    LinkMonthly,
    NodesPerSwitch,
    ReloadH,
    RepairH,
    ReplaceH,
    Seed,
    Switches,
    SwitchMonthly,
    TimeoutS,
    param_errors,
    print_parameters,
)
from scheduler_svc.planning.fit import Fit
from scheduler_svc.planning.params import (
    load_config,
    simulate_params,
)

SIMULATE_HELP = (sim.__doc__ or "").split("The kernels step")[0]


def simulate_command(  # noqa: PLR0917  # one parameter per option; click passes them by name
    gpus: Annotated[int | None, typer.Option(help=f"GPUs in the job. [{DEFAULTS.gpus}]")] = None,
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
    dp: Dp = None,
    node_replace_h: ReplaceH = None,
    repair_h: RepairH = None,
    runs: Annotated[int | None, typer.Option(help="Monte Carlo runs. [10000]")] = None,
    seed: Seed = None,
    json_out: JsonOut = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Write the CDF of GPU-hours per policy to this file, in the format its "
            "suffix names (.png, .svg or .pdf; needs matplotlib)."
        ),
    ] = None,
    config: Config = None,
    history: HistoryOpt = None,
    fill_defaults: FillDefaults = False,
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
        "dp": dp,
        "node_replace_h": node_replace_h,
        "repair_h": repair_h,
        "runs": runs,
        "seed": seed,
    }
    fitted_from: Fit | None = None
    with param_errors("simulate"):
        base: dict[str, object] = {}
        if history is not None:
            given = given_keys(load_config(config), flags)
            base, fitted_from = fitted(history, fill_defaults=fill_defaults, given=given)
        model, options = simulate_params(config, flags, base)
    if plot is not None:
        check_plot_path(plot)  # before the run, which may take minutes
    err = Console(stderr=True)
    total = options.runs * len(sim.POLICIES)
    with Progress(
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} policy-runs"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal or options.runs < 2000,
    ) as progress:
        task = progress.add_task("simulate", total=total)
        result = sim.simulate(
            model,
            options.runs,
            options.seed,
            on_chunk=lambda n: progress.advance(task, n),
        )
    if plot is not None:
        # Lazy: matplotlib is only needed, and only imported, for --plot.
        from scheduler_svc.planning.plot import plot_cdf  # noqa: PLC0415

        plot_cdf(result, plot)
    document = sim.result_json(result)
    if fitted_from is not None:
        document["history"] = fitted_from.as_json()
    if json_out:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = Console()
    if fitted_from is not None:
        print_fit(console, fitted_from)
    print_parameters(console, document["parameters"], "Parameters")
    for table in _simulate_tables(result):
        console.print(table)
    console.print(
        f"{result.runs:,} runs in {result.runtime_s:.2f} s. Reductions compare mean extra "
        "GPU-hours (GPU-hours above the fault-free job)."
        + (f" Plot written to {plot}." if plot is not None else "")
    )


def check_plot_path(path: Path) -> None:
    """Refuse a plot that could not be written, before anything is computed."""
    from scheduler_svc.planning.plot import FORMATS  # noqa: PLC0415  # matplotlib-free module

    suffix = path.suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        refuse(
            f"--plot {path}: cannot tell the format from the suffix {path.suffix or '(none)'!r}",
            f"end the name in one of {', '.join('.' + f for f in FORMATS)}",
        )
    folder = path.parent
    if not folder.is_dir():
        refuse(
            f"--plot {path}: the folder {folder} does not exist",
            f"create it first (mkdir -p {folder}) or write the plot elsewhere",
        )
    if not os.access(folder, os.W_OK):
        refuse(
            f"--plot {path}: the folder {folder} is not writable",
            "write the plot to a folder you may write to",
        )
    if importlib.util.find_spec("matplotlib") is None:
        refuse(
            "--plot needs matplotlib, which is not installed",
            "pip install 'railover[plot]' (or drop --plot)",
        )


def _simulate_tables(result: sim.SimulationResult) -> list[Table]:
    totals = Table(
        title="GPU-hours per policy (million GPU·h)", title_justify="left", box=box.SIMPLE_HEAD
    )
    totals.add_column("policy", no_wrap=True)
    for head in ("mean ± 95 % CI", "median", "p90", "p99"):
        totals.add_column(head, justify="right")
    extra = Table(
        title="Extra GPU-hours above fault-free (thousand GPU·h) and waste saved",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    extra.add_column("policy", no_wrap=True)
    for head in ("median", "p90", "p99", "vs restart", "vs restart+scaling"):
        extra.add_column(head, justify="right")
    for policy, st in result.stats.items():
        totals.add_row(
            policy,
            f"{st.mean_gpu_hours / 1e6:.4f} ± {st.ci95_gpu_hours / 1e6:.4f}",
            *(f"{st.gpu_hours[q] / 1e6:.4f}" for q in sim.QUANTILES),
        )
        red = result.reductions.get(policy, {})
        extra.add_row(
            policy,
            *(f"{st.extra_gpu_hours[q] / 1e3:,.1f}" for q in sim.QUANTILES),
            *(
                f"{red[key]['extra_gpu_hours']:.1%}" if key in red else "—"
                for key in ("vs_restart", "vs_restart_scaling")
            ),
        )
    return [totals, extra]

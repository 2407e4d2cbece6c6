"""Typer commands for the planning tools (`simulate`, `analytic`, `mirror-plan`).

Every command takes its parameters from flags, from a YAML file (`--config`,
same keys as the flags with underscores; flags win), or from the defaults,
which are the ReCCL paper's setup. Bad values exit with status 2 and two lines,
the flag with its problem and where to read more. Each prints the parameters it
used, as a table or inside `--json`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scheduler_svc.console import refuse
from scheduler_svc.planning import analytic as analytic_model
from scheduler_svc.planning import mirror
from scheduler_svc.planning import simulate as sim
from scheduler_svc.planning.params import (
    DEFAULT_ITERATION_S,
    DEFAULT_TIMEOUT_S,
    JobModel,
    ParamError,
    analytic_params,
    mirror_params,
    simulate_params,
)

_D = JobModel()

# --- options shared by simulate and analytic ------------------------------------------
GpusPerNode = Annotated[
    int | None, typer.Option(help=f"GPUs (and RNICs, one per GPU) per node. [{_D.gpus_per_node}]")
]
Hours = Annotated[float | None, typer.Option(help=f"Fault-free job length, hours. [{_D.hours:g}]")]
LinkMonthly = Annotated[
    float | None,
    typer.Option(
        help="Monthly failure probability per RNIC-ToR link, a fraction. "
        f"[{_D.link_failure_monthly:g} = 0.057 %]"
    ),
]
SwitchMonthly = Annotated[
    float | None,
    typer.Option(
        help="Monthly failure probability per ToR switch, a fraction. "
        f"[{_D.switch_failure_monthly:g} = 0.051 %]"
    ),
]
Switches = Annotated[
    int | None,
    typer.Option(help="ToR switch count. [rails × ceil(nodes / --nodes-per-switch)]"),
]
NodesPerSwitch = Annotated[
    int | None,
    typer.Option(help=f"Nodes per ToR on each rail, to derive --switches. [{_D.nodes_per_switch}]"),
]
Checkpoint = Annotated[
    str | None,
    typer.Option(
        help="'interval': checkpoints every --checkpoint-interval-h; 'flowcheck': a "
        "FlowCheck-style system checkpoints every iteration (--iteration-s), for every "
        "policy. [interval]"
    ),
]
IntervalH = Annotated[
    float | None,
    typer.Option(help=f"Checkpoint interval, hours of work. [{_D.checkpoint_interval_h:g}]"),
]
IterationS = Annotated[
    float | None,
    typer.Option(
        help=f"Iteration time, seconds (used with --checkpoint flowcheck). "
        f"[{DEFAULT_ITERATION_S:g}]"
    ),
]
DetectH = Annotated[
    float | None, typer.Option(help=f"T_detect: fleet manager detection, hours. [{_D.detect_h:g}]")
]
ReloadH = Annotated[
    float | None, typer.Option(help=f"T_reload: restart and reload, hours. [{_D.reload_h:g}]")
]
TimeoutS = Annotated[
    float | None,
    typer.Option(
        help="T_timeout: RNIC retransmission timeout, seconds. "
        f"[{DEFAULT_TIMEOUT_S:.1f} = NCCL's IB timeout 20, retry count 7]"
    ),
]
KList = Annotated[
    str | None,
    typer.Option(
        "--k",
        help="Slowdown k failed over, by number of concurrent faults (last covers more), "
        "comma list. [1.03,1.20,1.50]",
    ),
]
Dp = Annotated[int | None, typer.Option(help=f"Data-parallel size, for restart+scaling. [{_D.dp}]")]
ReplaceH = Annotated[
    float | None,
    typer.Option(help=f"Hours until a dropped node is replaced. [{_D.node_replace_h:g}]"),
]
RepairH = Annotated[
    float | None,
    typer.Option(
        help=f"Railover's repair estimate for a failed link or switch, hours. [{_D.repair_h:g}]"
    ),
]
Seed = Annotated[int | None, typer.Option(help="Random seed. [0]")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
Config = Annotated[
    Path | None,
    typer.Option(help="YAML file of parameters (keys as the flags, underscored); flags win."),
]

# mirror-plan tables longer than this are summarised unless --all is given.
SUMMARY_ROWS = 32
SIMULATE_HELP = (sim.__doc__ or "").split("The kernels step")[0]


@contextmanager
def _param_errors(command: str) -> Iterator[None]:
    try:
        yield
    except ParamError as exc:
        refuse(
            f"{exc.flag}: {exc.message}",
            f"`railover {command} --help` states every option and its default",
        )


def _print_parameters(console: Console, params: dict[str, Any], title: str) -> None:
    table = Table(title=title, show_header=False, title_justify="left", box=None)
    table.add_column("parameter", style="cyan")
    table.add_column("value")
    for key, value in params.items():
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                table.add_row(f"{key}.{sub}", _fmt_value(sub_value))
        else:
            table.add_row(key, _fmt_value(value))
    console.print(table)


def _fmt_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ",".join(_fmt_value(v) for v in value)
    return str(value)


def register(app: typer.Typer) -> None:
    """Attach the planning commands to the `railover` command line."""
    app.command("simulate", help=SIMULATE_HELP)(simulate_command)
    app.command("analytic", help=analytic_model.__doc__)(analytic_command)
    app.command("mirror-plan", help=mirror.__doc__)(mirror_plan_command)


# --- simulate ------------------------------------------------------------------------


def simulate_command(  # noqa: PLR0917  # one parameter per option; click passes them by name
    gpus: Annotated[int | None, typer.Option(help=f"GPUs in the job. [{_D.gpus}]")] = None,
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
    with _param_errors("simulate"):
        model, options = simulate_params(config, flags)
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
    if json_out:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = Console()
    _print_parameters(console, document["parameters"], "Parameters")
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


# --- analytic -------------------------------------------------------------------------


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
    with _param_errors("analytic"):
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
    _print_parameters(console, params, "Parameters")
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


# --- mirror-plan ----------------------------------------------------------------------


def mirror_plan_command(  # noqa: PLR0917  # one parameter per option; click passes them by name
    loss: Annotated[
        float | None, typer.Option(help="Per-packet loss probability p on a mirror link. [1e-6]")
    ] = None,
    dp: Annotated[int | None, typer.Option(help="DP ring size N. [16]")] = None,
    packets: Annotated[
        int | None, typer.Option(help="Gradient packets K per iteration. [100000]")
    ] = None,
    target: Annotated[
        float | None,
        typer.Option(help="Acceptable iterations that cannot be rebuilt, per year. [1]"),
    ] = None,
    iteration_s: Annotated[
        float | None,
        typer.Option(help=f"Iteration time, seconds. [{DEFAULT_ITERATION_S:g}]"),
    ] = None,
    rails: Annotated[int | None, typer.Option(help="Rails the ring is striped over. [8]")] = None,
    ranks_per_switch: Annotated[
        int | None, typer.Option(help="Ring ranks per ToR switch on one rail. [4]")
    ] = None,
    json_out: JsonOut = False,
    config: Config = None,
    all_rows: Annotated[
        bool,
        typer.Option(
            "--all",
            help=f"Print every row; by default tables longer than {SUMMARY_ROWS} rows are "
            "summarised (--json always has every row).",
        ),
    ] = False,
    job: Annotated[
        str | None,
        typer.Option(
            help="Plan for this registered job's real DP ring and rank-to-rail map, read "
            "from the service (then --dp, --rails and --ranks-per-switch come from it)."
        ),
    ] = None,
    url: Annotated[
        str,
        typer.Option(envvar="RAILOVER_URL", help="The service, for --job."),
    ] = "http://127.0.0.1:8080",
    token: Annotated[
        str | None,
        typer.Option(envvar="RAILOVER_TOKEN", help="Bearer token for --job (any role)."),
    ] = None,
) -> None:
    layout = None
    if job is not None:
        for flag, value in (
            ("--dp", dp),
            ("--rails", rails),
            ("--ranks-per-switch", ranks_per_switch),
        ):
            if value is not None:
                refuse(
                    f"{flag}: with --job it is the job's own; leave it out",
                    "`railover mirror-plan --help` states every option and its default",
                )
        layout = _job_layout(url, token, job)
        dp = len(layout.ring)
    flags: dict[str, object | None] = {
        "loss": loss,
        "dp": dp,
        "packets": packets,
        "target": target,
        "iteration_s": iteration_s,
        "rails": rails,
        "ranks_per_switch": ranks_per_switch,
    }
    with _param_errors("mirror-plan"):
        params = mirror_params(config, flags)
    result = mirror.plan(params, layout)
    document = result.as_json()
    if json_out:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = Console()
    _print_parameters(console, document["parameters"], "Parameters")
    table = Table(title="P_fail by monitored ranks M", title_justify="left", box=box.SIMPLE_HEAD)
    for head in ("M", "P_fail per iteration", "failed iterations / year", ""):
        table.add_column(head, justify="right")
    shown = _summary_rows(len(result.p_fail), result.recommended, all_rows)
    previous = 0
    for m in shown:
        if m > previous + 1:
            table.add_row("…", "", "", f"{m - previous - 1:,} rows left out (--all)")
        prob, per_year = result.p_fail[m - 1], result.failed_per_year[m - 1]
        mark = "◀ recommended" if result.recommended == m else ""
        table.add_row(str(m), f"{prob:.4e}", f"{per_year:.4g}", mark)
        previous = m
    console.print(table)
    if result.recommended is None:
        console.print(
            f"No M up to {params.dp} meets {params.target:g} failed iterations per year; "
            "lower the mirror-link loss or accept a higher target."
        )
        return
    title = "Where to mirror" if layout is None else f"Where to mirror job {layout.job_id}"
    placement = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    heads: tuple[str, ...] = ("rank", "rail", "switch", "note")
    if layout is not None:
        heads = ("ring", "rank", "node", "rnic", "rail", "switch", "note")
    for head in heads:
        placement.add_column(head)
    monitors = result.placement if all_rows else result.placement[:SUMMARY_ROWS]
    for mon in monitors:
        note = "shares its switch with another monitor" if mon.shares_switch else ""
        rail = "?" if mon.rail is None else str(mon.rail)
        if layout is None:
            placement.add_row(str(mon.rank), rail, mon.switch, note)
        else:
            placement.add_row(
                str(mon.rank), str(mon.job_rank), mon.node, mon.rnic or "?", rail, mon.switch, note
            )
    if len(monitors) < len(result.placement):
        more = f"{len(result.placement) - len(monitors):,} more (--all)"
        placement.add_row("…", *[""] * (len(heads) - 2), more)
    console.print(placement)


def _job_layout(url: str, token: str | None, job_id: str) -> mirror.JobLayout:
    """The job's first DP ring and where each of its ranks leaves, as the service has it."""
    import httpx  # noqa: PLC0415  # only --job talks to the service

    from scheduler_svc.client import RailoverClient, RailoverError  # noqa: PLC0415

    fix = "check --job, --url (RAILOVER_URL) and --token (RAILOVER_TOKEN)"
    try:
        with RailoverClient(url, token, retries=1) as rv:
            info = rv.get_job(job_id)
            paths = {p.rank: p for p in rv.job_paths(job_id).ranks}
            try:
                ring = mirror.dp_ring(info.dp_size, info.tp_size, info.pp_size, len(info.ranks))
            except ValueError as exc:
                refuse(f"--job: job {job_id!r}: {exc}", "register the job with its real layout")
            rails: dict[tuple[str, str], int | None] = {}
            for node in sorted({paths[r].node for r in ring}):
                for rnic in rv.get_node(node).rnics:
                    rails[(node, f"{rnic.name}/{rnic.port}")] = rnic.rail
    except RailoverError as exc:
        refuse(f"--job: the service answered {exc.status} for job {job_id!r}: {exc.body}", fix)
    except httpx.HTTPError as exc:
        refuse(f"--url: cannot reach the service at {url}: {exc}", fix)
    return mirror.JobLayout(
        job_id=job_id,
        dp=info.dp_size,
        tp=info.tp_size,
        pp=info.pp_size,
        ring=tuple(
            mirror.RingRank(
                rank=r,
                node=paths[r].node,
                rnic=paths[r].primary,
                rail=rails.get((paths[r].node, paths[r].primary or "")),
                switch=paths[r].primary_switch,
            )
            for r in ring
        ),
    )


def _summary_rows(count: int, recommended: int | None, everything: bool) -> list[int]:
    """The M values a summary shows: the first rows, those around the recommendation, the last."""
    if everything or count <= SUMMARY_ROWS:
        return list(range(1, count + 1))
    keep = set(range(1, 11)) | {count}
    if recommended is not None:
        keep |= set(range(max(1, recommended - 2), min(count, recommended + 2) + 1))
    return sorted(keep)

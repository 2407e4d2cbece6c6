"""`railover mirror-plan`: how many mirror links a DP ring needs, for a model or a live job."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from scheduler_svc.errors import refuse
from scheduler_svc.planning import mirror
from scheduler_svc.planning.cli_options import (
    Config,
    JsonOut,
    param_errors,
    print_parameters,
)
from scheduler_svc.planning.params import (
    DEFAULT_ITERATION_S,
    mirror_params,
)

# mirror-plan tables longer than this are summarised unless --all is given.
SUMMARY_ROWS = 32


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
    with param_errors("mirror-plan"):
        params = mirror_params(config, flags)
    result = mirror.plan(params, layout)
    document = result.as_json()
    if json_out:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    console = Console()
    print_parameters(console, document["parameters"], "Parameters")
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

    from scheduler_svc.fleet.client import RailoverClient, RailoverError  # noqa: PLC0415

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

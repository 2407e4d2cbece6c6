"""The options the planning commands share, and how they report parameters.

Every command takes its parameters from flags, from a YAML file (`--config`,
same keys as the flags with underscores; flags win), or from the defaults,
which are the ReCCL paper's setup (``DEFAULTS``). Bad values exit with status 2
and two lines, the flag with its problem and where to read more
(``param_errors``). Each command prints the parameters it used
(``print_parameters``), as a table or inside `--json`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from scheduler_svc.errors import refuse
from scheduler_svc.planning.params import (
    DEFAULT_ITERATION_S,
    DEFAULT_TIMEOUT_S,
    JobModel,
    ParamError,
)

DEFAULTS = JobModel()

# --- options shared by simulate and analytic ------------------------------------------
GpusPerNode = Annotated[
    int | None,
    typer.Option(help=f"GPUs (and RNICs, one per GPU) per node. [{DEFAULTS.gpus_per_node}]"),
]
Hours = Annotated[
    float | None, typer.Option(help=f"Fault-free job length, hours. [{DEFAULTS.hours:g}]")
]
LinkMonthly = Annotated[
    float | None,
    typer.Option(
        help="Monthly failure probability per RNIC-ToR link, a fraction. "
        f"[{DEFAULTS.link_failure_monthly:g} = 0.057 %]"
    ),
]
SwitchMonthly = Annotated[
    float | None,
    typer.Option(
        help="Monthly failure probability per ToR switch, a fraction. "
        f"[{DEFAULTS.switch_failure_monthly:g} = 0.051 %]"
    ),
]
Switches = Annotated[
    int | None,
    typer.Option(help="ToR switch count. [rails × ceil(nodes / --nodes-per-switch)]"),
]
NodesPerSwitch = Annotated[
    int | None,
    typer.Option(
        help=f"Nodes per ToR on each rail, to derive --switches. [{DEFAULTS.nodes_per_switch}]"
    ),
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
    typer.Option(help=f"Checkpoint interval, hours of work. [{DEFAULTS.checkpoint_interval_h:g}]"),
]
IterationS = Annotated[
    float | None,
    typer.Option(
        help=f"Iteration time, seconds (used with --checkpoint flowcheck). "
        f"[{DEFAULT_ITERATION_S:g}]"
    ),
]
DetectH = Annotated[
    float | None,
    typer.Option(help=f"T_detect: fleet manager detection, hours. [{DEFAULTS.detect_h:g}]"),
]
ReloadH = Annotated[
    float | None, typer.Option(help=f"T_reload: restart and reload, hours. [{DEFAULTS.reload_h:g}]")
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
Dp = Annotated[
    int | None, typer.Option(help=f"Data-parallel size, for restart+scaling. [{DEFAULTS.dp}]")
]
ReplaceH = Annotated[
    float | None,
    typer.Option(help=f"Hours until a dropped node is replaced. [{DEFAULTS.node_replace_h:g}]"),
]
RepairH = Annotated[
    float | None,
    typer.Option(
        help="Railover's repair estimate for a failed link or switch, hours. "
        f"[{DEFAULTS.repair_h:g}]"
    ),
]
Seed = Annotated[int | None, typer.Option(help="Random seed. [0]")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
Config = Annotated[
    Path | None,
    typer.Option(help="YAML file of parameters (keys as the flags, underscored); flags win."),
]


@contextmanager
def param_errors(command: str) -> Iterator[None]:
    try:
        yield
    except ParamError as exc:
        refuse(
            f"{exc.flag}: {exc.message}",
            f"`railover {command} --help` states every option and its default",
        )


def print_parameters(console: Console, params: dict[str, Any], title: str) -> None:
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

"""Server-side rendering of the status page (Jinja2 templates beside this module)."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache, partial
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from scheduler_svc.api.schemas.status import StatusOut
from scheduler_svc.services.status import FIRST_PAGE, NODE_PAGE, StatusQuery

# Columns of the cost cell, in the order a person compares them.
COST_OPTIONS = ("failover", "restart", "restart_scaled", "none")


def duration(seconds: float | None) -> str:
    """Seconds as a short human duration: 45 s, 25 min, 1.18 h, 30.0 h, 3.0 d.

    Hours keep two decimals below 10 h so two costs a few minutes apart (what a
    decision turns on) still read differently, as in the decision's own reason.
    """
    if seconds is None:
        return "-"
    s = abs(seconds)
    sign = "-" if seconds < 0 else ""
    if s < 90:
        return f"{sign}{s:.0f} s"
    if s < 3600:
        return f"{sign}{s / 60:.0f} min"
    if s < 10 * 3600:
        return f"{sign}{s / 3600:.2f} h"
    if s < 48 * 3600:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} d"


def gpu_hours(gpu_seconds: float | None) -> str:
    if gpu_seconds is None:
        return "-"
    hours = gpu_seconds / 3600
    return f"{hours:,.0f} GPU·h" if hours >= 100 else f"{hours:,.1f} GPU·h"


def since(at: datetime | None, now: datetime) -> str:
    return "-" if at is None else duration((now - at).total_seconds())


def clock(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S UTC")


@lru_cache(maxsize=1)
def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("scheduler_svc", "web"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(duration=duration, gpu_hours=gpu_hours, clock=clock)
    env.globals.update(since=since, cost_options=COST_OPTIONS)
    return env


def view_link(query: StatusQuery, **changes: Any) -> str:
    """The page's address for `query` with `changes` (a value None drops that parameter)."""
    params = {
        "rail": query.rail,
        "switch": query.switch,
        "health": None if query.health == "all" else query.health,
        "after_node": query.after_node,
        "limit": None if query.limit == NODE_PAGE else query.limit,
    }
    for key, value in changes.items():
        params[key] = None if value == "all" and key == "health" else value
    kept = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(kept) if kept else "./"


def render_live(status: StatusOut, query: StatusQuery = FIRST_PAGE) -> str:
    """The part of the page that refreshes: summary, fabric, grid, jobs, faults."""
    return (
        _env().get_template("live.html").render(s=status, q=query, view=partial(view_link, query))
    )


def render_page(status: StatusOut | None, refresh_s: int, query: StatusQuery = FIRST_PAGE) -> str:
    """The whole page; ``status`` None renders the viewer-token prompt instead of data."""
    return (
        _env()
        .get_template("status.html")
        .render(s=status, refresh_s=refresh_s, q=query, view=partial(view_link, query))
    )

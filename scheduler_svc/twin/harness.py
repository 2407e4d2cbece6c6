"""The service as the fleet twin runs it: its own settings and store, on a manual clock,
in this process over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from fastapi import FastAPI

from scheduler_svc.config import Settings
from scheduler_svc.engine.decision import Policy
from scheduler_svc.main import create_app
from scheduler_svc.twin.inprocess import ManualClock, served_app


def twin_settings(
    policy: Policy,
    db_url: str | None,
    tmp: Path,
    *,
    spare_reserve: int = 0,
    hard_failures_per_h: float = 0.0,
) -> Settings:
    """The service's settings in the twin: its defaults, the policy under study (the spares
    it keeps back, the rate it prices a spare by), a store of its own (SQLite in `tmp`;
    `db_url` must name an empty one), and no coordinator thread (the twin sweeps after
    each move of its clock)."""
    return Settings(
        db_url=db_url or f"sqlite:///{tmp / 'twin.db'}",
        port=0,
        allow_anonymous_loopback=True,  # the twin's agents and driver call it without tokens
        policy=policy,
        spare_reserve=spare_reserve,
        hard_failures_per_h=hard_failures_per_h,
        coordinator=False,
        command_ack_timeout_s=10**6,  # the twin's agents answer at once
    )


@contextmanager
def service(settings: Settings, start: datetime) -> Iterator[tuple[FastAPI, str, ManualClock]]:
    """The real service on loopback, on a manual clock at `start`."""
    clock = ManualClock(start)
    app = create_app(settings, clock=clock)
    with served_app(app) as base_url:
        yield app, base_url, clock

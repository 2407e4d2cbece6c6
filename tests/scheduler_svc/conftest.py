"""The service on a manual clock, as most of this directory's tests start it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.scheduler_svc.sequences import Start, services


@pytest.fixture
def make(db_url: str) -> Iterator[Start]:
    """The service, its coordinator and a manual clock on `db_url` (a module that needs
    other settings defines its own `make`)."""
    with services(db_url) as started:
        yield started

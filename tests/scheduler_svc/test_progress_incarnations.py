"""Op counts across incarnations: a restart's new processes count their collectives from
their own start, so the ended incarnation's counts must neither stay nor come back late.

Two nodes of 8 GPUs (hgx_node), rank r on GPU r % 8 of n(r // 8); communicator 77 over all
16 ranks. Over the HTTP API on a manual clock, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import ManualClock
from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.scheduler_svc.sequences import T0, Start, commands, ev, get, job, post

COMM = 77
OLD_OPS = 50_000  # where the ended incarnation's processes had got to


def progress(node: str, rank: int, ops: int, at: datetime, **whose: Any) -> dict[str, Any]:
    return ev(node, "progress", at, device=None, comm_id=COMM, rank=rank, ops_done=ops, **whose)


def counts(http: httpx.Client) -> dict[int, int]:
    return {p["rank"]: p["ops_done"] for p in get(http, "/v1/jobs/j/progress")["progress"]}


def restarted_on_a_spare(http: httpx.Client, clock: ManualClock) -> datetime:
    """Job j on n0 and n1, 100 s after its checkpoint, its ranks at OLD_OPS: n0/mlx5_3
    fails and it restarts; the fleet manager posts it again on n2 and n1 (incarnation 2).
    Returns when incarnation 2 started."""
    register_nodes(http, ["n0", "n1", "n2"])
    body = job_body(
        "j",
        ["n0", "n1"],
        last_checkpoint_at=(T0 - timedelta(seconds=100)).isoformat(),
        communicators=[{"comm_id": COMM, "channels": 16}],
    )
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, *(progress(f"n{r // 8}", r, OLD_OPS, T0, job_id="j") for r in range(16)))
    assert set(counts(http).values()) == {OLD_OPS}
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=1)))
    assert job(http, "j")["mode"] == "restarting"
    clock.advance(10)
    # From a checkpoint 50 minutes old: a fault now is failed over, not restarted.
    again = job_body(
        "j",
        ["n2", "n1"],
        last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat(),
        communicators=[{"comm_id": COMM, "channels": 16}],
    )
    r = http.post("/v1/jobs", json=again)
    assert r.status_code == 201, r.text
    assert r.json()["incarnation"] == 2
    return clock()


def test_a_new_incarnation_starts_with_no_op_counts(make: Start) -> None:
    http, clock = make()
    restarted_on_a_spare(http, clock)
    assert counts(http) == {}


@pytest.mark.parametrize(
    ("whose", "before_start"),
    [
        ({"job_id": "j", "incarnation": 1}, False),  # names the ended incarnation
        ({"job_id": "j"}, True),  # names none, observed before incarnation 2 started
        ({}, True),  # names neither job nor incarnation
    ],
    ids=["named-old", "unnamed-before-start", "anonymous-before-start"],
)
def test_a_late_count_of_the_ended_incarnation_moves_nothing(
    make: Start, whose: dict[str, Any], before_start: bool
) -> None:
    """The old processes' last report (arriving after the restart) is stored as an event
    and changes no rank's count, so the new processes' smaller counts that follow are
    kept, and the next switch point is where they are, not OLD_OPS ahead of them."""
    http, clock = make()
    started = restarted_on_a_spare(http, clock)
    clock.advance(5)
    at = started - timedelta(seconds=2) if before_start else clock()
    late = post(http, progress("n1", 9, OLD_OPS + 10, at, **whose))
    assert late["accepted"] == 1
    assert counts(http) == {}
    clock.advance(1)
    new = [
        progress("n2" if r < 8 else "n1", r, 100 + r, clock(), job_id="j", incarnation=2)
        for r in range(16)
    ]
    post(http, *new)
    assert counts(http) == {r: 100 + r for r in range(16)}

    # A fault now: the communicator's switch point counts from the new processes' ops.
    post(http, ev("n2", "port_down", clock(), device="mlx5_5"))
    (switch,) = {
        c["ops_done"] for c in commands(http, "j") if c["kind"] in ("rebalance", "balance")
    }
    assert 115 <= switch < OLD_OPS, switch


def test_an_unnamed_count_after_the_start_is_the_new_incarnations(make: Start) -> None:
    """A process that names no incarnation (an older plugin) reports after incarnation 2
    started: it is the new processes' count."""
    http, clock = make()
    restarted_on_a_spare(http, clock)
    clock.advance(5)
    post(http, progress("n1", 9, 42, clock()))
    assert counts(http) == {9: 42}


def test_a_count_naming_another_job_is_not_this_ones(make: Start) -> None:
    """Progress on communicator 0 (none registered) from a process that names job k: the
    rank number on n1 is job j's, but the process says it is not j's, so it is dropped."""
    http, clock = make()
    restarted_on_a_spare(http, clock)
    clock.advance(5)
    body = progress("n1", 9, 42, clock(), job_id="k")
    body["comm_id"] = 0
    post(http, body)
    body = progress("n1", 10, 43, clock(), job_id="j", incarnation=2)
    body["comm_id"] = 0
    post(http, body)
    assert {(p["comm_id"], p["rank"]) for p in get(http, "/v1/jobs/j/progress")["progress"]} == {
        (0, 10)
    }

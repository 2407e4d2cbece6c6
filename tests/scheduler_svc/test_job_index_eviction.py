"""The service's cache of job indexes holds one placement per job: a job placed anew (its
next incarnation) drops its old placement's entry, which no pass reads again. Before, up
to 32 stale placements stayed, each with the index of every rank (megabytes for a job of
thousands of ranks), and a month of restarts in the fleet twin grew the service's memory."""

from __future__ import annotations

import httpx
from sqlalchemy.engine import make_url

from scheduler_svc.config import Settings
from scheduler_svc.services.reconciler import INDEXES
from tests.scheduler_svc.helpers import event, job_body, register_nodes

JOB = "index-cache-job"


def placements_cached(settings: Settings) -> list[tuple[object, ...]]:
    """This store's entries of the job (the cache is the process's, shared by stores)."""
    store = make_url(settings.db_url).render_as_string(hide_password=True)
    return [k for k in list(INDEXES._jobs) if k[:2] == (store, JOB)]


def test_a_job_placed_anew_keeps_one_cached_placement(
    http: httpx.Client, settings: Settings
) -> None:
    register_nodes(http, ["a0", "a1", "a2", "a3"])
    comms = [{"comm_id": 11, "channels": 16}]
    assert (
        http.post("/v1/jobs", json=job_body(JOB, ["a0", "a1"], communicators=comms)).status_code
        == 201
    )
    fault = event("a1", device="mlx5_3", after_s=10)
    assert http.post("/v1/events", json={"events": [fault]}).status_code == 202
    first = placements_cached(settings)
    assert len(first) == 1

    again = job_body(JOB, ["a2", "a3"], communicators=comms, incarnation=2)
    assert http.post("/v1/jobs", json=again).status_code in (200, 201)
    fault = event("a3", device="mlx5_2", after_s=20)
    assert http.post("/v1/events", json={"events": [fault]}).status_code == 202
    now = placements_cached(settings)
    assert len(now) == 1 and now != first
    ranks = http.get(f"/v1/jobs/{JOB}").json()
    assert ranks["incarnation"] == 2

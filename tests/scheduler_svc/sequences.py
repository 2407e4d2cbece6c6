"""What the sequence tests share: a service on a manual clock, reports, and reading it back.

Both the regression tests of issue 28 (test_sequences_regressions*.py) and the model-based
test (test_sequences_model.py, benchmarks/bench_sequences_model.py) drive the service
through its public HTTP API only, on a clock they move themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from railover_testing import waiting
from railover_testing.local import ManualClock
from tests.scheduler_svc.helpers import job_body, register_nodes, service_factory, sweep

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

# The settings every sequence test runs under unless it says otherwise: a test sweeps when
# it has moved the clock (`settle`) and the coordinator's thread sweeps now and then beside
# it (its deadlines read the manual clock), damping and quiet periods are short enough to
# pass in a few advances, and an unacknowledged command is re-issued only when a test moves
# the clock that far on purpose.
SERVICE: dict[str, Any] = {
    "coordinator_interval_s": 0.25,
    "failback_damping_s": 60,
    "fault_quiet_s": 300,
    "command_ack_timeout_s": 10**6,
}

# Start() is a service on its own manual clock at T0 (settings overridden as asked).
Start = Callable[..., tuple[httpx.Client, ManualClock]]


@contextmanager
def services(db_url: str) -> Iterator[Start]:
    """Services under SERVICE on `db_url`, each on a manual clock at T0; stopped after."""
    with service_factory(db_url, **SERVICE) as start:

        def started(**overrides: Any) -> tuple[httpx.Client, ManualClock]:
            clock = ManualClock(T0)
            return start(clock=clock, **overrides).http, clock

        yield started


LIVE = ("issued", "delivered")  # a command still on its way to, or waiting on, its ranks
SWITCH_KINDS = ("rebalance", "failback", "balance")


def ev(
    node: str, kind: str, at: datetime, device: str | None = "mlx5_3", **extra: Any
) -> dict[str, Any]:
    """One agent report on port 1 of `device` (None: the node's), observed at `at`."""
    return {
        "event_id": str(uuid.uuid4()),
        "node": node,
        "kind": kind,
        "device": device,
        "port": 1,
        "observed_at": at.isoformat(),
        **extra,
    }


def post(http: httpx.Client, *events: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/events", json={"events": list(events)})
    assert r.status_code == 202, r.text
    out: dict[str, Any] = r.json()
    return out


def get(http: httpx.Client, path: str, **params: Any) -> Any:
    r = http.get(path, params=params)
    assert r.status_code == 200, f"GET {path}: {r.status_code} {r.text}"
    return r.json()


def decisions(http: httpx.Client, job: str) -> list[dict[str, Any]]:
    """The job's decisions, newest first."""
    out: list[dict[str, Any]] = get(http, f"/v1/jobs/{job}/decisions", limit=1000)["decisions"]
    return out


def commands(
    http: httpx.Client, job: str, kind: str | None = None, live: bool = False
) -> list[dict[str, Any]]:
    """The job's commands in the order they were issued (of `kind`; only live ones)."""
    out: list[dict[str, Any]] = get(http, f"/v1/jobs/{job}/commands")["commands"]
    return [
        c for c in out if (kind is None or c["kind"] == kind) and (not live or c["state"] in LIVE)
    ]


def job(http: httpx.Client, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = get(http, f"/v1/jobs/{job_id}")
    return out


def paths(http: httpx.Client, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = get(http, f"/v1/jobs/{job_id}/paths", limit=8192)
    return out


def faults(http: httpx.Client, *, open_: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = get(http, "/v1/faults", open="true" if open_ else "false")["faults"]
    return out


def ack(http: httpx.Client, cmd: dict[str, Any], status: str, **extra: Any) -> dict[str, Any]:
    """The whole node answers `cmd` (as the agent aggregates its ranks' acks)."""
    body = {"node": cmd["node"], "status": status, **extra}
    r = http.post(f"/v1/commands/{cmd['command_id']}/acks", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def poll(http: httpx.Client, node: str) -> list[dict[str, Any]]:
    """What the node's agent is handed now (marks them delivered)."""
    out: list[dict[str, Any]] = get(http, f"/v1/nodes/{node}/commands")["commands"]
    return out


def wait_for(
    what: str, check: Callable[[], object], detail: Callable[[], object] | None = None
) -> None:
    waiting.wait_for(what, check, 30, detail)


def settle(http: httpx.Client) -> None:
    """A whole coordinator sweep run since this call (here, at once, rather than waited
    for): whatever the clock's deadlines make it do (close cleared faults, fail back,
    retry commands) is done."""
    sweep(http)


def post_job(
    http: httpx.Client,
    job_id: str,
    nodes: list[str],
    *,
    elapsed_s: float = 3000,
    last_checkpoint_at: datetime | None = None,
    comm: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """Post a job whose last checkpoint was `elapsed_s` before T0 (50 min into an hour:
    failing over beats restarting) or at `last_checkpoint_at`; `comm` its one communicator."""
    at = last_checkpoint_at or T0 - timedelta(seconds=elapsed_s)
    body = job_body(
        job_id,
        nodes,
        last_checkpoint_at=at.isoformat(),
        communicators=[] if comm is None else [comm],
        **kw,
    )
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


COMM = {"comm_id": 77, "channels": 16}


def active(http: httpx.Client, job_id: str, rank: int) -> str | None:
    """The RNIC port rank `rank` uses now, as /paths says."""
    row = paths(http, job_id)["ranks"][rank]
    assert row["rank"] == rank
    out: str | None = row["active"]
    return out


def port_state(http: httpx.Client, node: str, device: str) -> str:
    """The port's state as GET /v1/nodes/{node} shows it."""
    (row,) = [r for r in get(http, f"/v1/nodes/{node}")["rnics"] if r["name"] == device]
    out: str = row["state"]
    return out


def ranks_of(cmds: list[dict[str, Any]]) -> set[int]:
    return {r for c in cmds for r in c["ranks"]}


def checkpoint(http: httpx.Client, job_id: str, at: datetime, **extra: Any) -> dict[str, Any]:
    r = http.post(f"/v1/jobs/{job_id}/checkpoints", json={"at": at.isoformat(), **extra})
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def restarted_at_a_checkpoint(http: httpx.Client, clock: ManualClock) -> datetime:
    """n0/mlx5_3 fails under job j (n0, n1; communicator 77); a minute later a checkpoint,
    with a spare to restart on and a day's repair ahead, restarts it. When it was taken."""
    register_nodes(http, ["n0", "n1"])
    post_job(http, "j", ["n0", "n1"], comm=COMM)
    post(http, ev("n0", "port_down", T0))
    at = clock.advance(60)
    checkpoint(http, "j", at)
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]
    return at

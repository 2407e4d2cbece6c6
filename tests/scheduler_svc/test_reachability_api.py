"""Reachability is a level, over the real HTTP API on SQLite and PostgreSQL (issue 28, case 8).

n0's agent is partitioned away: the failover sent to it goes unacknowledged through its
last attempt, the node is held unreachable and the job restarts. When the agent is
heard from again (a poll, a stream it opens, an ack), the node is reachable: the fault
closes with who was heard, and the next incarnation is not restarted at once on it.
The service runs on a clock the test moves; the coordinator's sweep reads the same clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing.local import ManualClock
from scheduler_svc import metrics
from scheduler_svc.api import commands as commands_api
from scheduler_svc.config import Settings
from scheduler_svc.store import uow
from scheduler_svc.store.commands import CommandRepo
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from tests.scheduler_svc.helpers import job_body, register_nodes, service_factory
from tests.scheduler_svc.sequences import ev, post
from tests.scheduler_svc.test_command_stream import stream
from tests.scheduler_svc.test_fault_lifecycle_api import T0, as_, commands, decisions, wait_for
from tests.scheduler_svc.test_listen import NO_RECHECK_S  # a heartbeat no test reaches

ACK_S = 10  # the ack deadline; two attempts, so the node is unreachable 20 s in


@pytest.fixture
def make(db_url: str) -> Iterator[Callable[..., tuple[httpx.Client, ManualClock, str]]]:
    defaults: dict[str, Any] = {
        "coordinator_interval_s": 0.05,
        "failback_damping_s": 60,
        "command_ack_timeout_s": ACK_S,
        "command_max_attempts": 2,
    }
    with service_factory(db_url, **defaults) as start:

        def started(**overrides: Any) -> tuple[httpx.Client, ManualClock, str]:
            clock = ManualClock(T0)
            svc = start(clock=clock, **overrides)
            return svc.http, clock, svc.url

        yield started


def body() -> dict[str, Any]:
    # No communicators: the failover is the one command, and it goes to n0 alone.
    return job_body(
        "j", ["n0", "n1"], last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat()
    )


def open_faults(http: httpx.Client) -> list[tuple[str, str]]:
    return [(f["kind"], f["node"]) for f in http.get("/v1/faults?open=true").json()["faults"]]


def partition(http: httpx.Client, clock: ManualClock) -> None:
    """n0's port fails while its agent is cut off: nobody takes or answers the failover."""
    register_nodes(http, ["n0", "n1"])
    assert http.post("/v1/jobs", json=body()).status_code == 201
    post(http, ev("n0", "port_down", T0))
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]
    clock.advance(ACK_S + 1)
    # Re-issued under a new id (a stream held open may take it: delivered, never answered).
    wait_for(lambda: [c["state"] for c in commands(http, "j", "failover")][:1] == ["superseded"])
    clock.advance(ACK_S + 1)
    wait_for(lambda: decisions(http, "j")[0]["action"] == "restart")
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]
    assert "not acknowledged after 2 attempts" in decisions(http, "j")[0]["reason"]
    assert sorted(open_faults(http)) == [("link_down", "n0"), ("unreachable", "n0")]


def closed_unreachable(http: httpx.Client) -> dict[str, Any]:
    faults: list[dict[str, Any]] = http.get("/v1/faults?open=false").json()["faults"]
    (fault,) = [f for f in faults if f["kind"] == "unreachable"]
    return fault


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize("how", ["poll", "stream", "ack"])
def test_a_partitioned_node_is_reachable_again_when_its_agent_is_heard_from(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]], how: str
) -> None:
    http, clock, url = make()
    partition(http, clock)
    aborts = commands(http, "j", "abort")
    assert sorted(c["node"] for c in aborts) == ["n0", "n1"]
    heard = clock.advance(1)
    before = metrics.NODES_REACHABLE_AGAIN.labels(how=how)._value.get()
    # The partition heals: n0's agent reaches the service, and gets its abort.
    if how == "poll":
        r = http.get("/v1/nodes/n0/commands")
        assert r.status_code == 200, r.text
        assert [c["kind"] for c in r.json()["commands"]] == ["abort"]
        what = "polled for commands"
    elif how == "stream":
        with stream(url, "n0", heartbeat_s=NO_RECHECK_S) as s:
            s.wait("its abort", lambda s: len(s.items) >= 2)
            assert [(k, d["kind"]) for k, _, d in s.items[1:]] == [("command", "abort")]
        what = "opened its command stream"
    else:
        (abort,) = [c for c in aborts if c["node"] == "n0"]
        ack = {"node": "n0", "status": "applied"}
        r = http.post(f"/v1/commands/{abort['command_id']}/acks", json=ack)
        assert (r.status_code, r.json()["state"]) == (200, "applied")
        what = f"acknowledged command {abort['command_id']} (applied)"
    assert open_faults(http) == [("link_down", "n0")]
    fault = closed_unreachable(http)
    assert (
        fault["resolved_reason"] == f"reachable again: its agent (no token, open loopback) {what}"
    )
    assert fault["resolved_by"] is None
    assert fault["resolved_at"] == iso(heard)
    assert metrics.NODES_REACHABLE_AGAIN.labels(how=how)._value.get() == before + 1
    # Reachable again decides nothing for the aborted incarnation.
    assert [d["action"] for d in decisions(http, "j")] == ["restart", "failover"]
    # The fleet manager posts the next incarnation: it starts on the paths left (n0's port
    # is still down), rather than being restarted at once for a node that answers.
    r = http.post("/v1/jobs", json=body() | {"last_checkpoint_at": heard.isoformat()})
    assert r.status_code == 201, r.text
    assert r.json()["mode"] == "failed_over"
    latest = decisions(http, "j")[0]
    assert (latest["action"], latest["trigger"].startswith("replan:")) == ("failover", True)
    assert "restarted job starts on its backups" in latest["reason"]
    assert [d["action"] for d in decisions(http, "j")] == ["failover", "restart", "failover"]
    assert len(commands(http, "j", "abort")) == len(aborts)
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [3]


@pytest.fixture
def tokens(db_url: str) -> dict[str, tuple[str, str]]:
    """(token id, secret) of a fleet token and of n0's agent token."""
    engine = make_engine(Settings(db_url=db_url).sqlalchemy_url)
    out = {}
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        now = datetime.now(UTC)
        for name, role, node in (("fleet", "fleet", None), ("n0", "agent", "n0")):
            row, secret = repo.create(role=role, node=node, description=name, now=now)
            out[name] = (row.token_id, secret)
        s.commit()
    engine.dispose()
    return out


def test_only_the_nodes_agent_arriving_counts_not_a_stream_held_open_nor_a_fleet_token(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
    tokens: dict[str, tuple[str, str]],
) -> None:
    _, clock, url = make()
    agent_id, agent_secret = tokens["n0"]
    agent_auth = {"Authorization": f"Bearer {agent_secret}"}
    with as_(url, tokens["fleet"][1]) as fleet:
        # n0's stream was opened before the partition and stays open on the service's side
        # (a half-open connection): what it is sent after that is no word from the agent.
        with stream(url, "n0", headers=agent_auth, heartbeat_s=NO_RECHECK_S) as held:
            held.wait("ready", lambda s: s.kinds() == ["ready"])
            partition(fleet, clock)
            held.wait("the abort", lambda s: "abort" in [d["kind"] for k, _, d in s.items[1:]])
            assert ("unreachable", "n0") in open_faults(fleet)
            # A fleet token polling for n0 is not n0's agent.
            r = fleet.get("/v1/nodes/n0/commands")
            assert r.status_code == 200, r.text
            assert ("unreachable", "n0") in open_faults(fleet)
            # n0's agent opens a stream again: reachable.
            with stream(url, "n0", headers=agent_auth, heartbeat_s=NO_RECHECK_S) as again:
                again.wait("ready", lambda s: s.items)
            assert open_faults(fleet) == [("link_down", "n0")]
        fault = closed_unreachable(fleet)
        assert fault["resolved_reason"] == (
            f"reachable again: its agent (token {agent_id}) opened its command stream"
        )
        assert [d["action"] for d in decisions(fleet, "j")] == ["restart", "failover"]


def test_a_poll_of_a_reachable_node_writes_nothing(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check rides on the poll's one read; only a node held unreachable costs a write."""
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    writes: list[str] = []
    reads: list[tuple[bool, bool]] = []
    real_uow, real_look = uow.unit_of_work, CommandRepo.look

    def unit_of_work(*args: Any, **kwargs: Any) -> Any:
        writes.append("write")
        return real_uow(*args, **kwargs)

    def look(self: CommandRepo, node: str, include_delivered: bool) -> Any:
        out = real_look(self, node, include_delivered)
        reads.append((out.pending, out.unreachable))
        return out

    monkeypatch.setattr(commands_api, "unit_of_work", unit_of_work)
    monkeypatch.setattr(CommandRepo, "look", look)
    for params in ({}, {"include_unacked": True}, {}, {"wait_s": 0.2}):
        r = http.get("/v1/nodes/n0/commands", params=params)
        assert r.status_code == 200 and r.json() == {"commands": []}, r.text
    assert writes == []
    assert reads and set(reads) == {(False, False)}
    # Held unreachable, the node's next poll is the one write that clears it.
    partition(http, clock)
    writes.clear()
    r = http.get("/v1/nodes/n0/commands")
    assert [c["kind"] for c in r.json()["commands"]] == ["abort"]
    assert writes == ["write"] and reads[-1] == (True, True)
    assert ("unreachable", "n0") not in open_faults(http)
    writes.clear()
    reads.clear()
    assert http.get("/v1/nodes/n0/commands").json() == {"commands": []}
    assert writes == [] and reads in ([], [(False, False)])

"""The fault lifecycle over the real HTTP API, on SQLite and PostgreSQL.

The service runs on a clock the test moves, so quiet periods and damping pass when
the test says, and the coordinator's sweep (which reads the same clock) does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from railover_testing import waiting
from railover_testing.cluster_shapes import hgx_node
from railover_testing.local import ManualClock
from scheduler_svc.config import Settings
from scheduler_svc.store.db import make_engine, make_sessionmaker
from scheduler_svc.store.tokens import TokenRepo
from tests.scheduler_svc.helpers import job_body, register_nodes, service_factory
from tests.scheduler_svc.sequences import ev, post

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def make(db_url: str) -> Iterator[Callable[..., tuple[httpx.Client, ManualClock, str]]]:
    defaults: dict[str, Any] = {
        "coordinator_interval_s": 0.05,
        "failback_damping_s": 60,
        "fault_quiet_s": 300,
        "command_ack_timeout_s": 10**6,  # these tests move time; acks are not their subject
    }
    with service_factory(db_url, **defaults) as start:

        def started(**overrides: Any) -> tuple[httpx.Client, ManualClock, str]:
            clock = ManualClock(T0)
            svc = start(clock=clock, **overrides)
            return svc.http, clock, svc.url

        yield started


def decisions(http: httpx.Client, job: str) -> list[dict[str, Any]]:
    r = http.get(f"/v1/jobs/{job}/decisions")
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["decisions"]
    return out


def commands(http: httpx.Client, job: str, kind: str | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = http.get(f"/v1/jobs/{job}/commands").json()["commands"]
    return [c for c in out if kind is None or c["kind"] == kind]


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> None:
    waiting.wait_for("the condition", check, timeout)


def start_job(http: httpx.Client, job: str, nodes: list[str], **kw: Any) -> None:
    body = job_body(
        job,
        nodes,
        last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat(),
        communicators=[{"comm_id": kw.pop("comm_id", 77), "channels": 16}],
        **kw,
    )
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text


def test_cqe_fault_on_an_active_port_closes_after_the_quiet_period(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "cqe_error", T0, wc_status=12))
    assert decisions(http, "j")[0]["action"] == "failover"
    # A new error 200 s in restarts the quiet period: it now ends at 500 s.
    clock.advance(200)
    assert (
        post(http, ev("n0", "cqe_error", T0 + timedelta(seconds=200), wc_status=12))[
            "faults_opened"
        ]
        == 0
    )
    clock.advance(200)
    (fault,) = http.get("/v1/faults?open=true").json()["faults"]
    assert (fault["kind"], fault["health"]) == ("retry_exceeded", "recovering")
    assert fault["clears_at"] == (T0 + timedelta(seconds=500)).isoformat().replace("+00:00", "Z")
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    clock.advance(101)
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"
    back = commands(http, "j", "failback")
    assert {c["node"] for c in back} == {"n0", "n1"}
    assert len({(c["ops_done"], c["epoch"]) for c in back}) == 1  # one op count for all
    (closed,) = http.get("/v1/faults?open=false").json()["faults"]
    assert "no new error for 300 s" in closed["resolved_reason"]
    assert http.get("/v1/faults?open=true").json()["faults"] == []


@pytest.fixture
def tokens(db_url: str) -> dict[str, str]:
    engine = make_engine(Settings(db_url=db_url).sqlalchemy_url)
    out = {}
    with make_sessionmaker(engine)() as s:
        repo = TokenRepo(s)
        now = datetime.now(UTC)
        out["fleet"] = repo.create(role="fleet", node=None, description="ops", now=now)[1]
        out["viewer"] = repo.create(role="viewer", node=None, description="", now=now)[1]
        for n in ("n0", "n1"):
            out[n] = repo.create(role="agent", node=n, description="", now=now)[1]
        s.commit()
    engine.dispose()
    return out


def as_(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def test_operator_resolve_fails_back_at_once_and_only_fleet_may(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]], tokens: dict[str, str]
) -> None:
    _, _, url = make()
    with (
        as_(url, tokens["fleet"]) as fleet,
        as_(url, tokens["viewer"]) as viewer,
        as_(url, tokens["n0"]) as agent,
    ):
        register_nodes(fleet, ["n0", "n1"])
        start_job(fleet, "j", ["n0", "n1"])
        post(agent, ev("n0", "port_down", T0))  # it never comes back up by itself
        assert decisions(fleet, "j")[0]["action"] == "failover"
        (fault,) = fleet.get("/v1/faults", params={"job_id": "j"}).json()["faults"]
        assert fault["evidence"]["first_event_id"]
        assert fault["health"] == "failed" and fault["resolved_at"] is None
        assert len(fleet.get("/v1/faults", params={"node": "n0"}).json()["faults"]) == 1
        assert fleet.get("/v1/faults", params={"node": "n1"}).json()["faults"] == []
        assert fleet.get("/v1/faults", params={"job_id": "nope"}).status_code == 404
        assert fleet.get("/v1/faults", params={"node": "bad name"}).status_code == 422
        for who in (viewer, agent):
            assert who.get("/v1/faults").status_code == 403
            r = who.post(f"/v1/faults/{fault['id']}/resolve", json={"reason": "replaced cable"})
            assert r.status_code == 403, r.text
        assert fleet.post(f"/v1/faults/{fault['id']}/resolve", json={}).status_code == 422
        r = fleet.post(f"/v1/faults/{fault['id']}/resolve", json={"reason": "replaced cable"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["fault"]["resolved_by"] is not None
        assert out["fault"]["resolved_reason"] == "resolved by an operator: replaced cable"
        (failback,) = [d for d in decisions(fleet, "j") if d["decision_id"] in out["decisions"]]
        assert failback["action"] == "failback"
        assert fleet.get("/v1/jobs/j").json()["mode"] == "normal"
        back = commands(fleet, "j", "failback")
        assert len({(c["ops_done"], c["epoch"]) for c in back}) == 1
        assert (
            fleet.post(f"/v1/faults/{fault['id']}/resolve", json={"reason": "x"}).status_code == 409
        )
        assert fleet.post("/v1/faults/99999/resolve", json={"reason": "x"}).status_code == 404
        audit = fleet.get("/v1/audit").json()["entries"]
        resolved = [a for a in audit if a["operation"] == "resolve_fault" and a["status"] == 200]
        assert resolved[0]["detail"] == f"resolve fault {fault['id']}: replaced cable"


def test_partial_failback_keeps_the_dead_rails_ranks_on_backup_and_its_channels_off(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(
        http, ev("n0", "port_down", T0, device="mlx5_3"), ev("n1", "port_down", T0, device="mlx5_5")
    )
    first = decisions(http, "j")[0]
    assert first["action"] == "failover"
    assert {m["rank"] for m in first["plan"]["failed_over"]} == {3, 13}
    clock.advance(10)
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=10), device="mlx5_3"))
    clock.advance(61)
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    back = decisions(http, "j")[0]
    assert back["plan"]["returning"] == [{"rank": 3, "node": "n0", "gpu": 3, "to": "mlx5_3/1"}]
    assert back["plan"]["still_failed_over"] == [13]
    paths = http.get("/v1/jobs/j/paths").json()
    assert paths["failed_over_ranks"] == [13]
    assert paths["ranks"][3]["active"] == "mlx5_3/1"
    assert paths["ranks"][13]["active"] == "mlx5_4/1"
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    # Every rank of the communicator is told one switch point that keeps rail 5 off.
    failbacks = commands(http, "j", "failback")
    assert {c["node"] for c in failbacks} == {"n0", "n1"}
    assert {tuple(c["disabled_channels"]) for c in failbacks} == {(5, 13)}
    assert sorted(r for c in failbacks for r in c["ranks"]) == list(range(16))


def test_quarantined_port_carries_no_traffic_until_the_flag_is_cleared(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    r = http.post(
        "/v1/maintenance-flags",
        json={"node": "n0", "device": "mlx5_3", "port": 1, "reason": "optics replacement"},
    )
    assert r.status_code == 201, r.text
    flag = r.json()
    assert flag["source"] == "operator"
    assert decisions(http, "j")[0]["action"] == "failover"
    assert "quarantined" in decisions(http, "j")[0]["reason"]
    paths = http.get("/v1/jobs/j/paths").json()
    assert paths["ranks"][3]["active"] == "mlx5_2/1" and paths["failed_over_ranks"] == [3]
    # An unrelated fault and its fail-back leave the flagged port out of service.
    post(http, ev("n1", "port_down", T0, device="mlx5_5"))
    # Observed before the down: history, the port stays down.
    post(http, ev("n1", "port_up", T0 - timedelta(seconds=100), device="mlx5_5"))
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [3, 13]
    post(http, ev("n1", "port_up", T0, device="mlx5_5"))
    clock.advance(61)  # past the damping period: rank 13 fails back, rank 3 stays
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [3]
    r = http.delete(f"/v1/maintenance-flags/{flag['id']}")
    assert r.status_code == 200, r.text
    latest = decisions(http, "j")[0]
    assert (latest["action"], latest["trigger"]) == ("failback", f"failback:flag:{flag['id']}")
    paths = http.get("/v1/jobs/j/paths").json()
    assert paths["ranks"][3]["active"] == "mlx5_3/1" and paths["failed_over_ranks"] == []
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"


def test_topology_change_under_a_running_job_is_a_fault_on_the_lost_part(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, _, _ = make()
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    start_job(http, "gpu-job", ["n0", "n1"], comm_id=77)
    start_job(http, "nic-job", ["n2", "n3"], comm_id=78)
    without_gpu7 = hgx_node()
    without_gpu7["gpus"] = without_gpu7["gpus"][:7]
    r = http.put("/v1/nodes/n0", json=without_gpu7)
    assert r.status_code == 200, r.text
    (lost,) = decisions(http, "gpu-job")
    assert lost["action"] == "restart" and "n0/gpu7" in lost["reason"]
    assert {"component": "n0/gpu7", "kind": "gpu_lost"}.items() <= lost["plan"][
        "failed_components"
    ][0].items()
    assert post(http, ev("n0", "port_down", T0, device="mlx5_1"))["accepted"] == 1
    paths = http.get("/v1/jobs/gpu-job/paths")
    assert paths.status_code == 200, paths.text
    assert paths.json()["isolated_ranks"] == [7]
    # The RNIC that rank 19 (n2's GPU 3) uses as primary disappears.
    without_nic = hgx_node()
    without_nic["rnics"] = [n for n in without_nic["rnics"] if n["name"] != "mlx5_3"]
    assert http.put("/v1/nodes/n2", json=without_nic).status_code == 200
    (moved,) = decisions(http, "nic-job")
    assert moved["action"] == "failover" and "RNIC n2/mlx5_3 is gone" in moved["reason"]
    paths = http.get("/v1/jobs/nic-job/paths").json()
    assert paths["failed_over_ranks"] == [3] and paths["ranks"][3]["active"] == "mlx5_2/1"
    # The same registration again changes nothing: no decision, no command.
    before = len(commands(http, "nic-job"))
    assert http.put("/v1/nodes/n2", json=without_nic).status_code == 200
    assert len(decisions(http, "nic-job")) == 1 and len(commands(http, "nic-job")) == before
    # The RNIC is back: the loss clears and the rank returns to it.
    assert http.put("/v1/nodes/n2", json=hgx_node()).status_code == 200
    back = decisions(http, "nic-job")[0]
    assert back["action"] == "failback"
    assert http.get("/v1/jobs/nic-job/paths").json()["failed_over_ranks"] == []


def test_same_state_twice_and_flowcheck_checkpoints_decide_at_most_once(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"], repair_estimate_s=1200)
    down = ev("n0", "port_down", T0)
    post(http, down)
    assert len(decisions(http, "j")) == 1
    n_cmds = len(commands(http, "j"))
    post(http, down)  # the same event again
    register_nodes(http, ["n0", "n1"])  # the same registrations again
    assert len(decisions(http, "j")) == 1 and len(commands(http, "j")) == n_cmds
    for _ in range(100):
        at = clock.advance(6)
        r = http.post("/v1/jobs/j/checkpoints", json={"at": at.isoformat(), "kind": "flowcheck"})
        assert r.status_code == 201, r.text
    history = decisions(http, "j")
    assert [d["action"] for d in history] == ["none", "failover"]
    assert history[0]["reason"].startswith("keep running degraded")
    assert len(commands(http, "j")) == n_cmds


def test_restarting_job_leaves_restarting_when_posted_again(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, _, _ = make()
    register_nodes(http, ["n0", "n1", "n2"])
    body = job_body("j", ["n0", "n1"], last_checkpoint_at=(T0 - timedelta(seconds=100)).isoformat())
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, ev("n0", "port_down", T0))
    assert decisions(http, "j")[0]["action"] == "restart"
    assert http.get("/v1/jobs/j").json()["mode"] == "restarting"
    # Faults while it restarts decide nothing.
    post(http, ev("n1", "port_down", T0, device="mlx5_6"))
    assert len(decisions(http, "j")) == 1
    again = job_body("j", ["n2", "n1"], last_checkpoint_at=T0.isoformat())
    r = http.post("/v1/jobs", json=again)
    assert r.status_code == 201, r.text
    # The new incarnation starts on the paths n1's open fault leaves it: no second restart.
    assert r.json()["mode"] == "failed_over"
    latest = decisions(http, "j")[0]
    assert (
        latest["action"] == "failover" and "restarted job starts on its backups" in latest["reason"]
    )
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [14]
    assert http.post("/v1/jobs", json=again).status_code == 409  # running again: a duplicate


def test_refused_command_makes_its_node_unreachable_until_the_agent_registers_again(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    http, _, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0))
    (cmd,) = commands(http, "j", "failover")
    bad = {"node": "n0", "rank": 3, "status": "too_late", "ops_done": -1}
    assert http.post(f"/v1/commands/{cmd['command_id']}/acks", json=bad).status_code == 422
    refused = {"node": "n0", "rank": 3, "status": "failed", "detail": "no backup QP"}
    r = http.post(f"/v1/commands/{cmd['command_id']}/acks", json=refused)
    assert (r.status_code, r.json()["state"]) == (200, "failed")
    latest = decisions(http, "j")[0]
    assert latest["action"] == "restart"
    assert "failover command" in latest["reason"] and "no backup QP" in latest["reason"]
    (unreachable,) = [
        f for f in http.get("/v1/faults?open=true").json()["faults"] if f["kind"] == "unreachable"
    ]
    assert unreachable["node"] == "n0"
    # Its agent starts again and registers: the node is reachable evidence no more.
    register_nodes(http, ["n0"])
    assert [f["kind"] for f in http.get("/v1/faults?open=true").json()["faults"]] == ["link_down"]


def test_a_job_whose_reconcile_failed_is_reconciled_by_the_coordinator(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]], db_url: str
) -> None:
    from sqlalchemy import select, update

    from scheduler_svc.store import models as m

    http, _, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0))
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    # What a replica leaves behind when it recorded the evidence (the fault closed) but
    # reconciling the job raised: the evidence is committed and the job is marked.
    engine = make_engine(Settings(db_url=db_url).sqlalchemy_url)
    with engine.begin() as conn:
        conn.execute(update(m.Fault).values(resolved_at=T0, cleared_at=T0))
        conn.execute(update(m.Job).values(reconcile_due_at=T0))
    engine.dispose()
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"
    # Reconciled in the transaction that cleared the mark: it is not tried again.
    engine = make_engine(Settings(db_url=db_url).sqlalchemy_url)
    with engine.connect() as conn:
        assert conn.execute(select(m.Job.reconcile_due_at)).scalar_one() is None
    engine.dispose()
    assert [d["action"] for d in decisions(http, "j")] == ["failback", "failover"]


def test_a_report_whose_pass_never_ran_is_reconciled_once_its_grace_is_over(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]], db_url: str
) -> None:
    """A report commits its evidence, then has its jobs reconciled; a process that
    dies between the two leaves the job marked due, and the coordinator takes over
    only after the report's own pass would have ended (no second pass per report)."""
    from sqlalchemy import select

    from scheduler_svc.api.schemas.events import EventIn
    from scheduler_svc.services.events import REPORT_PASS_GRACE, ingest
    from scheduler_svc.services.sweeps import sweep_once
    from scheduler_svc.store import models as m
    from scheduler_svc.store.db import make_read_sessionmaker

    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    settings = Settings(db_url=db_url)
    engine = make_engine(settings.sqlalchemy_url)
    sessions, reads = make_sessionmaker(engine), make_read_sessionmaker(engine)
    try:
        with sessions() as s:
            report = EventIn.model_validate(ev("n0", "port_down", T0))
            result = ingest(s, [report], now=clock(), settings=settings)
            s.commit()  # ... and the process dies here, before the pass
        assert result.jobs == ["j"]
        with reads() as s:
            due = s.scalar(select(m.Job.reconcile_due_at))
        assert due is not None and due.replace(tzinfo=UTC) == clock() + REPORT_PASS_GRACE
        # Within the grace the coordinator leaves the job to the report's pass.
        sweep_once(sessions, reads, clock(), settings)
        assert http.get("/v1/jobs/j").json()["mode"] == "normal" and decisions(http, "j") == []
        clock.advance(REPORT_PASS_GRACE.total_seconds())
        waiting.wait_for(
            "the coordinator's failover",
            lambda: [d["action"] for d in decisions(http, "j")] == ["failover"],
            30,
        )
        with reads() as s:
            assert s.scalar(select(m.Job.reconcile_due_at)) is None
    finally:
        engine.dispose()


def live(http: httpx.Client, job: str, kind: str) -> list[dict[str, Any]]:
    return [c for c in commands(http, job, kind) if c["state"] in ("issued", "delivered")]


def test_a_failover_overtakes_a_failback_on_its_way_without_communicators(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    """Issue 28, case 4: the port fails again before the fail-back's op count."""
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    body = job_body(
        "j", ["n0", "n1"], last_checkpoint_at=(T0 - timedelta(seconds=3000)).isoformat()
    )
    assert http.post("/v1/jobs", json=body).status_code == 201
    post(http, ev("n0", "port_down", T0))
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=5)))
    clock.advance(66)
    wait_for(lambda: len(live(http, "j", "failback")) == 1)
    (back,) = live(http, "j", "failback")
    assert back["ranks"] == [3]  # only the rank that returns is told (case 3)
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=70)))
    assert live(http, "j", "failback") == []
    assert [c["state"] for c in commands(http, "j", "failback")] == ["superseded"]
    again = [c for c in live(http, "j", "failover") if c["command_id"] > back["command_id"]]
    assert [(c["ranks"], c["epoch"] > back["epoch"]) for c in again] == [([3], True)]
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [3]
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"


def test_a_failover_overtakes_a_failback_of_a_communicator_with_a_new_switch_point(
    make: Callable[..., tuple[httpx.Client, ManualClock, str]],
) -> None:
    """The communicator's pending fail-back (rail 6 still out) gives way to one switch
    point (a newer epoch) that keeps rails 3 and 6 out; nothing returns rank 3 to its
    dead primary, and it is not told to move: it never left its backup."""
    http, clock, _ = make()
    register_nodes(http, ["n0", "n1"])
    start_job(http, "j", ["n0", "n1"])
    post(http, ev("n0", "port_down", T0), ev("n0", "port_down", T0, device="mlx5_6"))
    assert http.get("/v1/jobs/j/paths").json()["failed_over_ranks"] == [3, 6]
    for c in commands(http, "j"):  # the ranks take it: 3 and 6 are on their backups
        r = http.post(
            f"/v1/commands/{c['command_id']}/acks", json={"node": c["node"], "status": "applied"}
        )
        assert r.status_code == 200, r.text
    post(http, ev("n0", "port_up", T0 + timedelta(seconds=5)))
    clock.advance(66)
    wait_for(lambda: len(live(http, "j", "failback")) == 2)  # one per node
    first = live(http, "j", "failback")
    assert {c["epoch"] for c in first} == {first[0]["epoch"]}
    assert first[0]["disabled_channels"] == [6, 14]
    post(http, ev("n0", "port_down", T0 + timedelta(seconds=70)))
    assert live(http, "j", "failback") == []
    # The plan is R²CCL balance here: its switch point replaces the fail-back.
    switch = live(http, "j", "balance")
    assert {c["node"] for c in switch} == {"n0", "n1"}
    assert {(c["epoch"], tuple(c["disabled_channels"])) for c in switch} == {
        (first[0]["epoch"] + 1, (3, 6, 11, 14))
    }
    # Rank 3 never left its backup: no failover after the first one.
    assert [c["command_id"] for c in commands(http, "j", "failover")] == [1]
    paths = http.get("/v1/jobs/j/paths").json()
    assert paths["failed_over_ranks"] == [3, 6]
    assert paths["ranks"][3]["active"] == "mlx5_2/1"

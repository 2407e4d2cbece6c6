"""Cluster-wide coordination over the real API: correlation, flaps, fail-back, re-decisions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from railover_testing import waiting
from railover_testing.local import ManualClock
from scheduler_svc.engine.decision import spare_price_s
from tests.scheduler_svc.helpers import job_body, register_nodes, service_factory
from tests.scheduler_svc.sequences import ev, post

FAST = {
    "failback_damping_s": 1.0,
    "coordinator_interval_s": 0.1,
    "command_ack_timeout_s": 30.0,
}


@pytest.fixture
def make_service(db_url: str) -> Iterator[Callable[..., httpx.Client]]:
    """Start the service with coordination settings tuned for tests; yields a client factory."""
    with service_factory(db_url, **FAST) as start:
        yield lambda **kw: start(**kw).http


def decisions(http: httpx.Client, job: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = http.get(f"/v1/jobs/{job}/decisions").json()["decisions"]
    return out


def wait_for(check: Callable[[], bool], timeout: float = 15.0) -> None:
    waiting.wait_for("the condition", check, timeout)


def sweeps() -> float:
    """Coordinator sweeps run so far in this process (the service under test runs in it)."""
    return REGISTRY.get_sample_value("railover_coordinator_sweeps_total", {"outcome": "ok"}) or 0.0


def fresh_job(http: httpx.Client, job: str, nodes: list[str], elapsed_s: float, **kw: Any) -> None:
    checkpoint = datetime.now(UTC) - timedelta(seconds=elapsed_s)
    body = job_body(job, nodes, last_checkpoint_at=checkpoint.isoformat(), **kw)
    r = http.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text


def test_switch_inferred_and_silent_node_moved_first(
    make_service: Callable[..., httpx.Client],
) -> None:
    http = make_service()
    nodes = ["n0", "n1", "n2", "n3"]
    register_nodes(http, nodes)
    fresh_job(http, "big", nodes, elapsed_s=3000)
    t0 = datetime.now(UTC)
    post(http, ev("n0", "port_down", t0))
    post(http, ev("n1", "port_down", t0 + timedelta(seconds=0.6)))
    third = post(http, ev("n2", "port_down", t0 + timedelta(seconds=1.2)))
    assert len(third["decisions"]) == 1
    fabric = http.get("/v1/fabric").json()
    assert [(s["switch"], s["nodes"]) for s in fabric["switch_faults"]] == [
        ("rail3-leaf", ["n0", "n1", "n2"])
    ]
    latest = decisions(http, "big")[0]
    assert latest["trigger"].startswith("switch:")
    assert "switch rail3-leaf inferred failed" in latest["reason"]
    assert latest["action"] == "failover"
    moved = {(m["node"], m["rank"]) for m in latest["plan"]["failed_over"]}
    assert moved == {("n0", 3), ("n1", 11), ("n2", 19), ("n3", 27)}
    # n3 has reported nothing, yet its rank 27 is told to move now.
    n3 = http.get("/v1/nodes/n3/commands").json()["commands"]
    assert ("failover", [27]) in [(c["kind"], c["ranks"]) for c in n3]
    # n3's own report arrives later: no second switch fault.
    post(http, ev("n3", "port_down", t0 + timedelta(seconds=4)))
    assert len(http.get("/v1/fabric").json()["switch_faults"]) == 1


def test_an_inferred_switch_clears_only_once_every_port_under_it_has_damped(
    make_service: Callable[..., httpx.Client],
) -> None:
    """Issue 28, case 5: one node's port up must not clear the switch for the others."""
    t0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    clock = ManualClock(t0)
    http = make_service(clock=clock, coordinator_interval_s=0.05, failback_damping_s=60)
    nodes = ["n0", "n1", "n2", "n3"]
    register_nodes(http, nodes)
    r = http.post("/v1/jobs", json=job_body("big", nodes, last_checkpoint_at=t0.isoformat()))
    assert r.status_code == 201, r.text
    clock.advance(3000)
    for i, n in enumerate(["n0", "n1", "n2"]):
        post(http, ev(n, "port_down", clock() + timedelta(seconds=0.5 * i)))
    assert len(http.get("/v1/fabric").json()["switch_faults"]) == 1
    everyone = [3, 11, 19, 27]

    def failed_over() -> list[int]:
        got: list[int] = http.get("/v1/jobs/big/paths").json()["failed_over_ranks"]
        return got

    assert failed_over() == everyone
    assert [d["action"] for d in decisions(http, "big")] == ["failover"] * 3
    # n0 comes back: the switch stays failed (n1 and n2 are still down), n3 stays moved.
    post(http, ev("n0", "port_up", clock() + timedelta(seconds=2)))
    clock.advance(61)
    wait_for(lambda: sweeps() > 0)
    before = sweeps()
    wait_for(lambda: sweeps() > before + 1)  # a sweep ran past n0's damping
    assert len(http.get("/v1/fabric").json()["switch_faults"]) == 1
    assert failed_over() == everyone
    # Each node's port fault and then the switch moved ranks: three failovers, no fail-back.
    assert [d["action"] for d in decisions(http, "big")] == ["failover"] * 3
    # The last two come back; once they have damped, the switch clears and all return.
    post(http, ev("n1", "port_up", clock()), ev("n2", "port_up", clock()))
    assert failed_over() == everyone
    clock.advance(61)
    wait_for(lambda: http.get("/v1/fabric").json()["switch_faults"] == [])
    wait_for(lambda: decisions(http, "big")[0]["action"] == "failback")
    assert failed_over() == []
    assert [d["action"] for d in decisions(http, "big")] == ["failback"] + ["failover"] * 3


def test_a_port_that_failed_on_its_own_before_the_switch_does_not_hold_the_switch_failed(
    make_service: Callable[..., httpx.Client],
) -> None:
    """n4's cable on rail3-leaf broke ten minutes before the switch did, and stays broken. The
    switch's own failure (n0-n2 within the window) clears once those ports are back and
    damped: n3's rank fails back with theirs, n4's stays on its backup under its own fault.
    Found by the fleet twin: a day-long cable fault held a leaf failed for hours after its
    repair, and every flap on another rail of that leaf then left GPUs with no path."""
    t0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
    clock = ManualClock(t0)
    http = make_service(clock=clock, coordinator_interval_s=0.05, failback_damping_s=60)
    nodes = ["n0", "n1", "n2", "n3", "n4"]
    register_nodes(http, nodes)
    r = http.post("/v1/jobs", json=job_body("big", nodes, last_checkpoint_at=t0.isoformat()))
    assert r.status_code == 201, r.text
    clock.advance(2900)
    post(http, ev("n4", "port_down", clock()))
    clock.advance(600)
    for i, n in enumerate(["n0", "n1", "n2"]):
        post(http, ev(n, "port_down", clock() + timedelta(seconds=0.5 * i)))
    assert len(http.get("/v1/fabric").json()["switch_faults"]) == 1

    def failed_over() -> list[int]:
        got: list[int] = http.get("/v1/jobs/big/paths").json()["failed_over_ranks"]
        return got

    assert failed_over() == [3, 11, 19, 27, 35]
    post(http, *(ev(n, "port_up", clock() + timedelta(seconds=5)) for n in ["n0", "n1", "n2"]))
    clock.advance(70)
    wait_for(lambda: http.get("/v1/fabric").json()["switch_faults"] == [])
    wait_for(lambda: failed_over() == [35])
    still = http.get("/v1/faults", params={"open": "true"}).json()["faults"]
    assert [f["node"] for f in still] == ["n4"]


def test_single_short_flap_fails_over_and_back(make_service: Callable[..., httpx.Client]) -> None:
    http = make_service()
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=3000)
    t0 = datetime.now(UTC) - timedelta(seconds=5)
    post(http, ev("n0", "port_down", t0))
    assert decisions(http, "j")[0]["action"] == "failover"
    post(http, ev("n0", "port_up", t0 + timedelta(seconds=3)))  # a 3-second flap
    wait_for(lambda: decisions(http, "j")[0]["action"] == "failback")
    back = decisions(http, "j")[0]
    assert back["plan"]["returning"] == [{"rank": 3, "node": "n0", "gpu": 3, "to": "mlx5_3/1"}]
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"
    failbacks = [
        c for c in http.get("/v1/jobs/j/commands").json()["commands"] if c["kind"] == "failback"
    ]
    # No communicator registered: only the returning rank is told (issue 28, case 3).
    assert [(c["node"], c["ranks"]) for c in failbacks] == [("n0", [3])]


def test_flapping_port_stays_on_backup_and_is_flagged(
    make_service: Callable[..., httpx.Client],
) -> None:
    http = make_service()
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=3000)
    t0 = datetime.now(UTC) - timedelta(seconds=400)
    for i in range(5):  # five downs within ten minutes
        post(http, ev("n0", "port_down", t0 + timedelta(seconds=60 * i)))
        post(http, ev("n0", "port_up", t0 + timedelta(seconds=60 * i + 5)))
    flags = http.get("/v1/fabric").json()["maintenance_flags"]
    assert [(f["node"], f["device"], f["port"]) for f in flags] == [("n0", "mlx5_3", 1)]
    assert "5 downs" in flags[0]["reason"]
    # Every flap is long past damping by its event times: three sweeps would fail it back.
    swept = sweeps()
    wait_for(lambda: sweeps() >= swept + 3)
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"
    history = [d["action"] for d in decisions(http, "j")]
    # The first flaps healed and failed back; after the fifth down it stays on its backup.
    assert history[0] == "failover"
    assert history.count("failover") == 5
    # Up and long past damping, but quarantined: rank 3 stays on its backup.
    paths = http.get("/v1/jobs/j/paths").json()
    assert paths["failed_over_ranks"] == [3] and paths["ranks"][3]["active"] == "mlx5_2/1"
    # The operator repairs it and clears the flag: the port is healthy, so it fails back.
    r = http.delete(f"/v1/maintenance-flags/{flags[0]['id']}")
    assert r.status_code == 200 and r.json()["cleared_at"] is not None
    assert decisions(http, "j")[0]["action"] == "failback"
    assert http.get("/v1/jobs/j").json()["mode"] == "normal"
    assert http.delete(f"/v1/maintenance-flags/{flags[0]['id']}").status_code == 404


def test_measured_k_turns_failover_into_restart(make_service: Callable[..., httpx.Client]) -> None:
    http = make_service()
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=1500, slowdown_k=None)
    baseline = http.post("/v1/jobs/j/iterations", json={"iteration_time_s": [1.0] * 5}).json()
    assert baseline["degraded"] is False
    post(http, ev("n0", "port_down", datetime.now(UTC)))
    first = decisions(http, "j")[0]
    assert (first["action"], first["inputs"]["k"], first["inputs"]["k_source"]) == (
        "failover",
        1.03,
        "default",
    )
    few = http.post("/v1/jobs/j/iterations", json={"iteration_time_s": [2.5] * 3}).json()
    assert few["trustworthy"] is False and few["decision_id"] is None
    r = http.post("/v1/jobs/j/iterations", json={"iteration_time_s": [2.5] * 3}).json()
    assert r["trustworthy"] is True and r["measured_k"] == 2.5
    latest = decisions(http, "j")[0]
    assert latest["decision_id"] == r["decision_id"]
    assert latest["action"] == "restart"
    assert latest["inputs"]["k"] == 2.5 and latest["inputs"]["k_source"] == "measured"
    assert "measured k 2.500" in latest["reason"]
    assert http.get("/v1/jobs/j").json()["mode"] == "restarting"


def test_second_fault_replans_with_higher_k(make_service: Callable[..., httpx.Client]) -> None:
    http = make_service()
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=3000, slowdown_k=None)
    now = datetime.now(UTC)
    post(http, ev("n0", "port_down", now, device="mlx5_0"))
    post(http, ev("n1", "port_down", now + timedelta(seconds=30), device="mlx5_5"))
    chain = decisions(http, "j")
    assert [(d["action"], d["inputs"]["k"], d["inputs"]["concurrent_faults"]) for d in chain] == [
        ("failover", 1.2, 2),
        ("failover", 1.03, 1),
    ]
    assert {m["rank"] for m in chain[0]["plan"]["failed_over"]} == {0, 13}


def test_too_late_rank_gets_a_new_epoch_once(make_service: Callable[..., httpx.Client]) -> None:
    # The service's clock stands still at the newest sample, so the projection from that
    # sample to the decision adds nothing and every op count below is exact.
    clock = ManualClock(datetime.now(UTC))
    http = make_service(clock=clock, delivery_latency_default_s=0.5)
    register_nodes(http, ["n0", "n1"])
    fresh_job(
        http, "j", ["n0", "n1"], elapsed_s=3000, communicators=[{"comm_id": 77, "channels": 16}]
    )
    t = clock() - timedelta(seconds=1)  # the newest sample is from the service's now
    for ops, dt in ((1000, 0), (1100, 1)):
        post(
            http,
            *[
                ev(
                    n,
                    "progress",
                    t + timedelta(seconds=dt),
                    device=None,
                    comm_id=77,
                    rank=r,
                    ops_done=ops,
                )
                for n, ranks in (("n0", range(8)), ("n1", range(8, 16)))
                for r in ranks
            ],
        )
    post(http, ev("n0", "port_down", clock()))
    cmds = [c for c in http.get("/v1/jobs/j/commands").json()["commands"] if c["kind"] == "balance"]
    # 100 ops/s x 0.5 s delivery x safety 2 = 100 ops past the highest count, 1100.
    first = cmds[0]["ops_done"]
    assert first == 1200
    # Epochs count per communicator over every kind: the failover took 1.
    assert {(c["node"], c["ops_done"], c["epoch"]) for c in cmds} == {
        ("n0", first, 2),
        ("n1", first, 2),
    }
    assert cmds[0]["disabled_channels"] == [3, 11]
    late = {"node": "n1", "rank": 9, "status": "too_late", "ops_done": first + 3}
    r = http.post(f"/v1/commands/{cmds[1]['command_id']}/acks", json=late)
    assert r.json()["state"] == "failed"
    again = {"node": "n0", "rank": 2, "status": "too_late", "ops_done": first + 1}
    http.post(f"/v1/commands/{cmds[0]['command_id']}/acks", json=again)
    after = [
        c for c in http.get("/v1/jobs/j/commands").json()["commands"] if c["kind"] == "balance"
    ]
    epochs = sorted({(c["epoch"], c["state"]) for c in after if c["state"] != "failed"})
    assert epochs == [(2, "superseded"), (3, "issued")]
    # Rank 9 is past the first trigger (at first + 3) though the stored progress says
    # 1100: the new one counts from there, never re-issuing an op count a rank has passed.
    (second,) = {c["ops_done"] for c in after if c["epoch"] == 3}
    assert second == first + 3 + 100
    # The job was not re-decided: a late rank is no fault.
    assert [d["action"] for d in decisions(http, "j")] == ["failover"]


def test_unacknowledged_command_is_retried_then_failed(
    make_service: Callable[..., httpx.Client],
) -> None:
    http = make_service(command_ack_timeout_s=0.3, command_max_attempts=2)
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=3000)
    post(http, ev("n0", "port_down", datetime.now(UTC)))
    wait_for(lambda: decisions(http, "j")[0]["action"] == "restart")
    latest = decisions(http, "j")[0]
    # The node that never answered is evidence like any fault: unreachable.
    assert latest["trigger"].startswith("fault:")
    assert "not acknowledged after 2 attempts" in latest["reason"]
    (unreachable,) = [
        f for f in http.get("/v1/faults?open=true").json()["faults"] if f["kind"] == "unreachable"
    ]
    assert unreachable["node"] == "n0"
    cmds = http.get("/v1/jobs/j/commands").json()["commands"]
    failover = [c for c in cmds if c["kind"] == "failover"]
    assert [c["state"] for c in failover] == ["superseded", "failed"]


def test_checkpoint_while_failed_over_redecides(make_service: Callable[..., httpx.Client]) -> None:
    http = make_service()
    register_nodes(http, ["n0", "n1", "n2", "n3"])
    fresh_job(http, "long-repair", ["n0", "n1"], elapsed_s=3000, repair_estimate_s=86400)
    fresh_job(http, "quick-repair", ["n2", "n3"], elapsed_s=3000, repair_estimate_s=1200)
    now = datetime.now(UTC)
    post(http, ev("n0", "port_down", now), ev("n2", "port_down", now))
    for job in ("long-repair", "quick-repair"):
        http.post(f"/v1/jobs/{job}/checkpoints", json={"at": datetime.now(UTC).isoformat()})
    long_ = decisions(http, "long-repair")[0]
    assert long_["action"] == "restart" and long_["reason"].startswith("restart at this checkpoint")
    quick = decisions(http, "quick-repair")[0]
    assert quick["action"] == "none" and quick["reason"].startswith("keep running degraded")
    assert http.get("/v1/jobs/quick-repair").json()["mode"] == "failed_over"


def test_a_checkpoint_saying_no_spare_is_free_keeps_the_job_running_degraded(
    make_service: Callable[..., httpx.Client],
) -> None:
    """Posted while a spare was free; by its checkpoint the spares are gone, and the fleet
    manager says so with the checkpoint: a restart would wait for a node, so the job keeps
    running failed over. A later checkpoint saying a spare is free again restarts it."""
    http = make_service()
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=3000, repair_estimate_s=86400)
    post(http, ev("n0", "port_down", datetime.now(UTC)))
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"

    none_free = {"at": datetime.now(UTC).isoformat(), "spare_nodes": False}
    assert http.post("/v1/jobs/j/checkpoints", json=none_free).status_code == 201
    kept = decisions(http, "j")[0]
    assert kept["action"] == "none" and "no spare node" in kept["reason"]
    assert http.get("/v1/jobs/j").json()["mode"] == "failed_over"

    one_free = {"at": datetime.now(UTC).isoformat(), "spare_nodes": True}
    assert http.post("/v1/jobs/j/checkpoints", json=one_free).status_code == 201
    restarted = decisions(http, "j")[0]
    assert restarted["action"] == "restart", restarted
    assert restarted["reason"].startswith("restart at this checkpoint")
    bad = {"at": datetime.now(UTC).isoformat(), "spare_nodes": "no"}
    r = http.post("/v1/jobs/j/checkpoints", json=bad)
    assert r.status_code == 422 and "spare_nodes" in r.text


def test_spares_kept_back_are_not_taken_by_a_restart_a_failover_could_spare(
    make_service: Callable[..., httpx.Client],
) -> None:
    """RAILOVER_SPARE_RESERVE 1: with one spare free (the count the fleet manager gives) the
    checkpoint keeps the job running degraded; with two it restarts. The count is shown on
    the job, and one that contradicts spare_nodes is refused naming both."""
    http = make_service(spare_reserve=1)
    register_nodes(http, ["n0", "n1"])
    fresh_job(http, "j", ["n0", "n1"], elapsed_s=3000, repair_estimate_s=86400, spares_free=1)
    assert http.get("/v1/jobs/j").json()["spares_free"] == 1
    post(http, ev("n0", "port_down", datetime.now(UTC)))
    one = {"at": datetime.now(UTC).isoformat(), "spares_free": 1}
    assert http.post("/v1/jobs/j/checkpoints", json=one).status_code == 201
    kept = decisions(http, "j")[0]
    assert kept["action"] == "none" and "beyond the 1 kept back, of 1 free" in kept["reason"]
    two = {"at": datetime.now(UTC).isoformat(), "spares_free": 2}
    assert http.post("/v1/jobs/j/checkpoints", json=two).status_code == 201
    assert decisions(http, "j")[0]["action"] == "restart"
    job = http.get("/v1/jobs/j").json()
    assert (job["spares_free"], job["spare_nodes"]) == (2, True)
    contradicts = {"at": datetime.now(UTC).isoformat(), "spares_free": 0, "spare_nodes": True}
    r = http.post("/v1/jobs/j/checkpoints", json=contradicts)
    assert r.status_code == 422 and "spares_free: 0 free spares, yet spare_nodes is True" in r.text


def test_a_restart_pays_for_the_spare_it_takes_when_the_fleet_prices_them(
    make_service: Callable[..., httpx.Client],
) -> None:
    """RAILOVER_HARD_FAILURES_PER_H 0.1: a fault 50 s into the interval would restart the
    job onto one of its 2 free spares, but a lost GPU or dead node that finds none waits a
    day for a node, and 2.4 of them are expected before the faulty node is repaired: the
    restart's cost carries that price, which the decision shows, and the job fails over."""
    day = 86400
    http = make_service(hard_failures_per_h=0.1)
    register_nodes(http, ["n0", "n1"])
    fresh_job(
        http,
        "j",
        ["n0", "n1"],
        elapsed_s=50,
        repair_estimate_s=86400,
        spares_free=2,
        node_replace_s=day,
    )
    post(http, ev("n0", "port_down", datetime.now(UTC)))
    (d,) = decisions(http, "j")
    price = spare_price_s(2, 0.1, day, day)
    assert d["inputs"]["spares_free"] == 2
    assert d["inputs"]["spare_price_s"] == pytest.approx(price)
    assert d["costs_s"]["restart"] == pytest.approx(30 + 600 + 3600 + price)
    assert d["action"] == "failover", d["reason"]

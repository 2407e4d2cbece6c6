"""The fleet twin (scheduler_svc.twin) over the real service: a short day in `make test`.

benchmarks/bench_twin.py runs the long ones (a month of 2,048 nodes, the policies side by
side, the planner against the twin).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler_svc.cli import app
from scheduler_svc.engine.decision import Policy
from scheduler_svc.fleet.client import RailoverClient
from scheduler_svc.planning.params import JobModel
from scheduler_svc.twin import harness
from scheduler_svc.twin.books import CAUSES, TwinJob, TwinResult
from scheduler_svc.twin.cluster import (
    ClusterSpec,
    Fault,
    FaultKind,
    Reports,
    fleet_rates,
    hard_failures_per_h,
    job_mix,
    trace,
)
from scheduler_svc.twin.loop import COMM_ID, Twin

DAY = 86400.0
# 64 nodes, 16 per leaf and rail; 4 spares; job-0 (interval checkpoints) on n00000-n00029,
# job-1 (FlowCheck) on n00030-n00059.
SPEC = ClusterSpec(nodes=64, spares=4, nodes_per_leaf=16, jobs=2)
HARD = (FaultKind.GPU, FaultKind.NODE)  # only a replacement fixes them


def checkpoints_told(monkeypatch: pytest.MonkeyPatch, twin: Twin) -> list[float]:
    """The twin's times of the checkpoints its jobs report to the service, as they come."""
    told: list[float] = []
    report = RailoverClient.report_checkpoint

    def counted(client: RailoverClient, job_id: str, **kw: Any) -> Any:
        told.append(twin.now_s)
        return report(client, job_id, **kw)

    monkeypatch.setattr(RailoverClient, "report_checkpoint", counted)
    return told


def test_a_shrunk_job_failed_over_loses_each_share_once() -> None:
    """Run with 12 of its 16 nodes and failed over at k = 1.5: a quarter of the time is lost
    as `scaled`, and of the rest a third (1 - 1/k) as `degraded`."""
    spec = ClusterSpec(nodes=16, spares=0, nodes_per_leaf=16, jobs=1)
    (job_spec,) = job_mix(spec, JobModel())
    job = TwinJob(replace(job_spec, k=1.5), COMM_ID, list(job_spec.nodes))
    job.nodes = job.nodes[:12]
    job.mode = "failed_over"
    job.accrue(3600.0)
    assert job.full_nodes == 16
    assert math.isclose(job.lost["scaled"], 900.0)
    assert math.isclose(job.lost["degraded"], 2700.0 / 3)
    assert math.isclose(job.progress, 2700.0 / 1.5)
    assert math.isclose(job.progress + sum(job.lost.values()), 3600.0)


def conserved(r: TwinResult) -> None:
    """The causes sum to the total: elapsed minus progress, kept apart from them."""
    assert math.isclose(sum(r.gpu_hours_lost.values()), r.gpu_hours_total, rel_tol=1e-9), r


def test_a_day_with_a_leaf_failure_and_a_nic_that_stays_broken() -> None:
    """rail3-leaf0 (nodes 0-15, job-0's) fails for four hours an hour in; a NIC of job-1's
    node 40 breaks two hours in and stays broken all day. Railover fails both jobs over
    (late enough after their checkpoints), fails job-0 back after the leaf's repair, and
    keeps every invariant."""
    faults = [
        Fault(3600 + 1800, FaultKind.LEAF, 0, 3, 4 * 3600, leaf="rail3-leaf0"),
        Fault(7200 + 1800, FaultKind.LINK, 40, 5, 10 * DAY),
    ]
    r = Twin(SPEC, days=1, seed=1, fault_scale=0, faults=faults).run()  # its own SQLite
    assert r.violations == {}, r.first_violation
    conserved(r)
    assert r.faults == {"leaf": 1, "link": 1}
    assert r.events == 16 * 2 + 1  # each node of the leaf down and up; the NIC down
    assert r.decisions.get("failover", 0) >= 2
    assert r.decisions.get("failback", 0) >= 1
    assert r.gpu_hours_lost["hang"] > 0 and r.gpu_hours_lost["degraded"] > 0


def test_restart_only_loses_what_the_closed_form_says() -> None:
    """restart-only on a fixed trace: three NICs of the job's nodes break for good, each
    hitting a rank's primary. Each costs timeout + detect + reload + the work since the
    checkpoint, times the job's GPUs, and nothing else is lost."""
    spec = ClusterSpec(nodes=16, spares=4, nodes_per_leaf=16, jobs=1)
    model = JobModel()
    (job,) = job_mix(spec, model)
    times = [5000.0, 20000.0, 40000.0]
    faults = [Fault(t, FaultKind.LINK, i, 2, 10 * DAY) for i, t in enumerate(times)]
    r = Twin(spec, days=1, seed=1, fault_scale=0, faults=faults, policy=Policy.RESTART_ONLY).run()
    assert r.violations == {}, r.first_violation
    assert r.decisions == {"restart": 3}
    conserved(r)
    # Checkpoints every interval from the start, and from each restart's end of reload.
    down = job.timeout_s + job.detect_s
    expected, since = 0.0, 0.0
    for t in times:
        lost = (t - since) % job.interval_s
        expected += down + job.reload_s + lost
        since = t + down + job.reload_s
    expected *= job.gpus / 3600
    assert math.isclose(r.gpu_hours_total, expected, rel_tol=0.01), (r.gpu_hours_lost, expected)
    assert r.gpu_hours_lost["degraded"] == r.gpu_hours_lost["waiting"] == 0


def test_a_trace_is_the_same_for_every_policy_and_scales_with_the_rates() -> None:
    model = JobModel()
    one = trace(SPEC, model, 7, seed=3, fault_scale=100)
    assert one == trace(SPEC, model, 7, seed=3, fault_scale=100)
    assert one != trace(SPEC, model, 7, seed=4, fault_scale=100)
    kinds = {f.kind for f in one}
    assert kinds >= {FaultKind.LINK, FaultKind.FLAP, FaultKind.CQE, FaultKind.RNIC}
    assert trace(SPEC, model, 7, seed=3, fault_scale=0) == []
    assert all(0 <= f.at < 7 * DAY for f in one) and one == sorted(one)


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"nodes": 1}, "nodes"),
        ({"spares": 64}, "spares"),
        ({"jobs": 61}, "jobs"),
        ({"nodes_per_leaf": 0}, "nodes_per_leaf"),
    ],
)
def test_a_cluster_that_cannot_be_is_refused_naming_the_option(
    kw: dict[str, int], what: str
) -> None:
    given = {"nodes": 64, "spares": 4} | kw
    with pytest.raises(ValueError, match=f"^{what}: "):
        ClusterSpec(
            nodes=given["nodes"],
            spares=given["spares"],
            nodes_per_leaf=given.get("nodes_per_leaf", 32),
            jobs=given.get("jobs", 2),
        )


def test_every_cause_is_named() -> None:
    assert CAUSES == ("hang", "lost_work", "reload", "degraded", "waiting", "scaled")


def test_late_twice_sent_and_reordered_reports_and_a_cut_off_agent_keep_every_invariant() -> None:
    """Half the reports held back up to a minute (so a flap's port_up often reaches the
    service before its port_down), half sent twice, node clocks 10 s apart, and node 3's
    agent cut off for ten minutes across a failure of one of its NICs: the service still
    stores every event once and never moves a rank onto a port whose newest report is down."""
    small = ClusterSpec(nodes=16, spares=2, nodes_per_leaf=8, jobs=2)  # jobs of 7 nodes
    flaps = [Fault(1800.0 * h, FaultKind.FLAP, h % 14, h % 8, 5.0) for h in range(1, 7)]
    faults = sorted(
        [
            *flaps,
            Fault(2 * 3600 + 600, FaultKind.PARTITION, 3, 0, 600.0),
            Fault(2 * 3600 + 660, FaultKind.LINK, 3, 6, 3600.0),
            Fault(4 * 3600, FaultKind.LEAF, 0, 2, 1800.0, leaf="rail2-leaf0"),
        ]
    )
    reports = Reports(delay_p=0.5, duplicate_p=0.5, max_delay_s=60, skew_s=10)
    r = Twin(small, days=0.2, seed=2, fault_scale=0, faults=faults, reports=reports).run()
    assert r.violations == {}, r.first_violation
    conserved(r)
    # The run did what it is for: reports overtaken, resent, and kept by the cut-off agent.
    assert r.reports["overtaken"] >= 1 and r.reports["twice"] >= 1, r.reports
    assert r.reports["held"] == 1, r.reports  # node 3's port_down, sent when it is back
    assert r.decisions.get("failover", 0) >= 2


def test_a_job_waits_for_a_spare_when_none_is_free() -> None:
    """One spare: the first broken node's job takes it; when a second node breaks, no
    healthy node is free, so the job waits, down, until that node's repair, and is placed
    back on it then. The wait is counted as its own cause. Placed the moment the port is
    up again, the job starts on its backup (the fault is still damping) and fails back."""
    spec = ClusterSpec(nodes=16, spares=1, nodes_per_leaf=16, jobs=1)
    (job,) = job_mix(spec, JobModel())
    repair = 6 * 3600.0
    faults = [
        Fault(5000.0, FaultKind.LINK, 0, 2, 10 * DAY),
        Fault(20000.0, FaultKind.LINK, 1, 2, repair),
    ]
    r = Twin(spec, days=1, seed=1, fault_scale=0, faults=faults, policy=Policy.RESTART_ONLY).run()
    assert r.violations == {}, r.first_violation
    assert r.decisions == {"restart": 2, "failover": 1, "failback": 1}
    conserved(r)
    # Aborted at 20000, detected after timeout + detect, placed again at the repair.
    waited = repair - job.timeout_s - job.detect_s
    assert math.isclose(r.gpu_hours_lost["waiting"], waited * job.gpus / 3600, rel_tol=1e-6)


def test_reports_that_cannot_be_are_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match=r"^delay_p: "):
        Reports(delay_p=1.5)
    with pytest.raises(ValueError, match=r"^skew_s: "):
        Reports(skew_s=-1)
    with pytest.raises(ValueError, match=r"^skew_s: at most the service"):
        Twin(SPEC, days=1, seed=1, fault_scale=0, faults=[], reports=Reports(skew_s=3600))


def test_a_lost_gpu_restarts_its_job_and_a_dead_node_is_requeued_by_the_fleet_manager() -> None:
    """Node 5's GPU 3 falls off the bus: its agent reports it lost and the service restarts
    job-0 onto a spare. Node 40 dies with its agent: the service hears nothing, so the fleet
    manager aborts job-1 once its launcher notices (timeout and detection) and posts it as
    its next incarnation on a spare; the node registers again after its repair."""
    faults = [
        Fault(5000.0, FaultKind.GPU, 5, 3, 6 * 3600.0),
        Fault(20000.0, FaultKind.NODE, 40, 0, 2 * 3600.0),
    ]
    r = Twin(SPEC, days=0.5, seed=1, fault_scale=0, faults=faults).run()
    assert r.violations == {}, r.first_violation
    conserved(r)
    assert r.faults == {"gpu": 1, "node": 1}
    assert r.decisions.get("restart", 0) == 1  # the GPU's; the dead node decided nothing
    assert r.fleet_aborts == 1
    assert r.gpu_hours_lost["hang"] > 0 and r.gpu_hours_lost["reload"] > 0
    assert r.gpu_hours_lost["waiting"] == 0  # four spares for two broken nodes


def test_two_gpu_losses_on_the_same_placement_are_two_restarts_not_one_twice() -> None:
    """No spare: the job waits out the first lost GPU's repair and comes back on the same
    nodes; a second GPU lost later restarts it again, for new evidence (the twin's own
    books had counted GPU losses as no evidence, a false violation under restart-only)."""
    spec = ClusterSpec(nodes=16, spares=0, nodes_per_leaf=16, jobs=1)
    faults = [
        Fault(5000.0, FaultKind.GPU, 3, 2, 3600.0),
        Fault(20000.0, FaultKind.GPU, 7, 5, 3600.0),
    ]
    r = Twin(spec, days=0.5, seed=1, fault_scale=0, faults=faults, policy=Policy.RESTART_ONLY).run()
    assert r.violations == {}, r.first_violation
    assert r.decisions.get("restart", 0) == 2
    assert r.gpu_hours_lost["waiting"] > 0
    conserved(r)


def test_a_job_that_may_shrink_restarts_without_the_broken_node_and_grows_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No spare, jobs that may shrink (a DP replica per node): node 3's GPU is lost for six
    hours. The service decides restart_scaled (waiting for a node is dearer), the fleet
    manager restarts the job on the other 15 nodes, and at the first checkpoint after the
    repair stops it cleanly and restarts it on all 16. Nothing is lost waiting; 1/16 of
    the shrunk time is lost as `scaled`; two reloads. Unable to shrink, the job waits."""
    spec = ClusterSpec(nodes=16, spares=0, nodes_per_leaf=16, jobs=1, scaling=True)
    (job,) = job_mix(spec, JobModel())
    assert job.allow_scaling
    repair = 6 * 3600.0
    faults = [Fault(5000.0, FaultKind.GPU, 3, 2, repair)]
    twin = Twin(spec, days=1, seed=1, fault_scale=0, faults=faults)
    told = checkpoints_told(monkeypatch, twin)
    r = twin.run()
    assert r.violations == {}, r.first_violation
    conserved(r)
    assert r.decisions == {"restart_scaled": 1}
    assert r.gpu_hours_lost["waiting"] == 0
    assert math.isclose(r.gpu_hours_lost["reload"], 2 * job.reload_s * job.gpus / 3600)
    running = 5000.0 + job.timeout_s + job.detect_s + job.reload_s  # shrunk, up again
    grown = running + job.interval_s * math.ceil((5000.0 + repair - running) / job.interval_s)
    shrunk_gpu_h = (grown - running) * job.gpus / 16 / 3600
    assert math.isclose(r.gpu_hours_lost["scaled"], shrunk_gpu_h, rel_tol=1e-6)
    # Grown back, it checkpoints once an interval from its reload: the checkpoint that
    # grew it goes on with no schedule of its own.
    after = told[told.index(grown) + 1 :]
    assert after and math.isclose(after[0], grown + job.reload_s + job.interval_s)
    assert all(math.isclose(b - a, job.interval_s) for a, b in itertools.pairwise(after)), after
    grown_job = twin.jobs[job.job_id]
    assert (grown_job.incarnation, len(grown_job.nodes)) == (3, 16)
    assert grown_job.on_backup == set()  # restarted whole: every rank on its primary

    fixed = ClusterSpec(nodes=16, spares=0, nodes_per_leaf=16, jobs=1)
    waited = Twin(fixed, days=1, seed=1, fault_scale=0, faults=faults).run()
    assert waited.violations == {}, waited.first_violation
    assert waited.decisions == {"restart": 1}
    assert waited.gpu_hours_lost["scaled"] == 0 and waited.gpu_hours_lost["waiting"] > 0


def test_a_job_that_may_shrink_waits_when_a_node_it_would_keep_is_dead() -> None:
    """No spare: node 3's GPU is lost and node 5 dies a second later (the service hears
    nothing of it). The service decides restart_scaled without node 3, but the job cannot
    run on node 5 either and no node is free to replace it: it waits for the repairs, down,
    and never runs shrunk."""
    spec = ClusterSpec(nodes=16, spares=0, nodes_per_leaf=16, jobs=1, scaling=True)
    repair = 6 * 3600.0
    faults = [
        Fault(5000.0, FaultKind.GPU, 3, 2, repair),
        Fault(5001.0, FaultKind.NODE, 5, 0, repair),
    ]
    twin = Twin(spec, days=1, seed=1, fault_scale=0, faults=faults)
    r = twin.run()
    assert r.violations == {}, r.first_violation
    conserved(r)
    assert r.decisions == {"restart_scaled": 1}
    assert r.gpu_hours_lost["scaled"] == 0 and r.gpu_hours_lost["waiting"] > 0
    (placed,) = twin.jobs.values()
    assert len(placed.nodes) == 16 and placed.state == "up"


def test_a_job_restarted_at_a_checkpoint_checkpoints_once_an_interval_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NIC breaks for good: railover fails the job over, and at its next checkpoint
    restarts it to get away. The job then checkpoints once per interval from its reload:
    the checkpoint that restarted it must not go on with a schedule of its own (it did,
    so the job checkpointed twice an interval after every such restart)."""
    spec = ClusterSpec(nodes=16, spares=4, nodes_per_leaf=16, jobs=1)
    (job,) = job_mix(spec, JobModel())
    twin = Twin(spec, days=1, seed=1, fault_scale=0,
                faults=[Fault(5000.0, FaultKind.LINK, 2, 2, 10 * DAY)])  # fmt: skip
    told = checkpoints_told(monkeypatch, twin)
    r = twin.run()
    assert r.violations == {}, r.first_violation
    assert r.decisions.get("restart") == 1 and r.decisions.get("failover") == 1
    restarted = told.index(7200.0)  # the first checkpoint after the fault: it restarts
    after = told[restarted + 1 :]
    assert after and after[0] == 7200.0 + job.reload_s + job.interval_s
    assert all(b - a == job.interval_s for a, b in itertools.pairwise(after)), after


def test_a_priced_spare_keeps_a_job_degraded_that_would_restart_onto_it() -> None:
    """A cable breaks for 10 days under a job at k=1.03: it fails over, and at its next
    checkpoint restarts onto one of the 2 spares (reload 1,800 s against 25,920 s lost
    running degraded). With the service pricing spares at 0.5 lost GPUs and dead nodes an
    hour, 120 of them are expected before the cable's repair, so a spare taken now leaves
    one of them waiting a day for a node (86,400 s): the job runs degraded on."""
    spec = ClusterSpec(nodes=16, spares=2, nodes_per_leaf=16, jobs=1)
    faults = [Fault(7260.0, FaultKind.LINK, 0, 2, 10 * DAY)]
    free = Twin(spec, days=1, seed=1, fault_scale=0, faults=faults).run()
    priced = Twin(spec, days=1, seed=1, fault_scale=0, faults=faults, hard_failures_per_h=0.5)
    kept = priced.run()
    for r in (free, kept):
        assert r.violations == {}, r.first_violation
        conserved(r)
    assert free.decisions == {"failover": 1, "restart": 1}
    assert kept.decisions == {"failover": 1, "none": 1}
    assert kept.gpu_hours_lost["reload"] == 0 < free.gpu_hours_lost["reload"]
    assert kept.gpu_hours_lost["degraded"] > free.gpu_hours_lost["degraded"]


def test_the_hard_failure_rate_is_the_traces_own() -> None:
    """The rate --price-spares gives the service is the rate of the trace's GPU losses and
    node deaths: their count over 30 days at 1,000x is within 4 sd of it."""
    model, scale, days = JobModel(), 1000.0, 30
    rate = hard_failures_per_h(SPEC, model, scale)
    rates = fleet_rates(SPEC, model)
    assert rate == (rates[FaultKind.GPU] + rates[FaultKind.NODE]) * scale
    hard = [f for f in trace(SPEC, model, days, 5, scale) if f.kind in HARD]
    expected = rate * days * 24
    assert abs(len(hard) - expected) < 4 * math.sqrt(expected), (len(hard), expected)
    fitted = hard_failures_per_h(SPEC, model, scale, {FaultKind.GPU: 1e-4})
    assert fitted == (1e-4 * SPEC.nodes * 8 + rates[FaultKind.NODE]) * scale


def test_price_spares_runs_the_service_with_the_traces_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`railover twin --price-spares`: the service's RAILOVER_HARD_FAILURES_PER_H is the
    trace's rate of GPU losses and node deaths, and the output says it."""
    given: list[float] = []
    real = harness.twin_settings

    def settings(*args: Any, **kw: Any) -> Any:
        made = real(*args, **kw)
        given.append(made.hard_failures_per_h)
        return made

    monkeypatch.setattr("scheduler_svc.twin.loop.twin_settings", settings)
    small = ["--nodes", "16", "--spares", "2", "--days", "0.05", "--fault-scale", "1000"]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["twin", *small, "--policy", "railover", "--price-spares"]
    )
    assert result.exit_code == 0, result.output
    spec = ClusterSpec(nodes=16, spares=2, nodes_per_leaf=32, jobs=2)
    rate = hard_failures_per_h(spec, JobModel(), 1000)
    assert given == [rate] and rate > 0
    assert f"spares priced by {rate:.4g} lost GPUs and dead nodes an hour" in result.output

"""A leaf switch fails: its nodes report at once, and their reports share passes.

Sixteen nodes of one job lose rail 2 (one leaf switch) and post together. Each
post must be answered after its evidence and the decision covering it have
committed, the outcome must be the one the same reports give one at a time (on a
second job of the same shape, on other nodes and switches), and every post is
counted once in the pass metrics, its evidence and audit entry once each in the
group commit's.
"""

from __future__ import annotations

import threading

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.scheduler_svc.helpers import event, job_body, register_nodes

NODES = 16
RAIL = 2


def counter(http: httpx.Client, name: str) -> float:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    return 0.0


def leaf(http: httpx.Client, prefix: str) -> list[str]:
    names = [f"{prefix}{i:02d}" for i in range(NODES)]
    register_nodes(http, names, switch_name=f"{prefix}-rail{{rail}}-leaf")
    body = job_body(prefix, names)
    assert http.post("/v1/jobs", json=body).status_code == 201
    return names


def outcome(http: httpx.Client, job: str) -> tuple[str, list[int], list[tuple[str, int]]]:
    """The job's stored mode, the ranks reconcile has failed over now, and every rank
    each stored command covered (by kind): what the passes committed, not a recount."""
    paths = http.get(f"/v1/jobs/{job}/paths").json()
    cmds = http.get(f"/v1/jobs/{job}/commands").json()["commands"]
    return (
        http.get(f"/v1/jobs/{job}").json()["mode"],
        paths["failed_over_ranks"],
        sorted({(c["kind"], r) for c in cmds for r in c["ranks"]}),
    )


def test_a_leaf_storm_is_decided_as_its_reports_one_at_a_time(
    http: httpx.Client, service: str
) -> None:
    storm, calm = leaf(http, "s"), leaf(http, "c")
    # The same reports one after the other, for the reference outcome.
    for i, n in enumerate(calm):
        r = http.post(
            "/v1/events", json={"events": [event(n, device=f"mlx5_{RAIL}", after_s=3000 + i)]}
        )
        assert r.status_code == 202, r.text
    requests_before = counter(http, "railover_report_reconcile_requests_total")
    passes_before = counter(http, "railover_report_reconcile_passes_total")
    works_before = counter(http, "railover_group_commit_works_sum")
    batches_before = counter(http, "railover_group_commit_works_count")
    audited_before = reports_audited(http)

    go = threading.Barrier(NODES)
    answers: dict[str, httpx.Response] = {}

    def report(i: int, node: str) -> None:
        with httpx.Client(base_url=service, timeout=60) as c:
            go.wait()
            body = {"events": [event(node, device=f"mlx5_{RAIL}", after_s=3000 + i)]}
            answers[node] = c.post("/v1/events", json=body)

    threads = [threading.Thread(target=report, args=(i, n)) for i, n in enumerate(storm)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers) == storm
    assert all(r.status_code == 202 and r.json()["accepted"] == 1 for r in answers.values())

    # Every rank on the failed rail moved, as in the reference; nothing else did.
    mode, moved, commanded = outcome(http, "s")
    assert (mode, moved, commanded) == outcome(http, "c")
    assert mode == "failed_over"
    assert moved == [i * 8 + RAIL for i in range(NODES)]
    assert commanded == [("failover", r) for r in moved]
    # The switch failure was inferred from the storm's faults, as from the calm ones.
    switches = {sf["switch"] for sf in http.get("/v1/fabric").json()["switch_faults"]}
    assert {f"s-rail{RAIL}-leaf", f"c-rail{RAIL}-leaf"} <= switches
    # Each post asked once; the passes that answered them are between one and one each.
    asked = counter(http, "railover_report_reconcile_requests_total") - requests_before
    passes = counter(http, "railover_report_reconcile_passes_total") - passes_before
    assert asked == NODES
    assert 1 <= passes <= NODES
    # Each post's evidence was written once, with its audit entry, in shared batches.
    works = counter(http, "railover_group_commit_works_sum") - works_before
    batches = counter(http, "railover_group_commit_works_count") - batches_before
    assert works == NODES
    assert 1 <= batches <= NODES
    assert reports_audited(http) - audited_before == NODES


def reports_audited(http: httpx.Client) -> int:
    """The audit log's accepted reports."""
    entries = http.get("/v1/audit", params={"limit": 1000}).json()["entries"]
    return sum(e["operation"] == "post_events" and e["status"] == 202 for e in entries)

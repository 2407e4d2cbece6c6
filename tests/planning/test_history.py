"""`railover export` of a store the real service filled over its API, and the fit of
`--history` from it: the rates that were put in come back out, and a history too small
for a figure is refused naming it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from scheduler_svc.cli import app
from scheduler_svc.config import Settings
from scheduler_svc.planning.fit import FLAP_S, fit, monthly_fraction, poisson_interval
from scheduler_svc.planning.history import HISTORY_VERSION, History
from scheduler_svc.twin.harness import service
from tests.scheduler_svc.helpers import job_body, register_nodes
from tests.scheduler_svc.sequences import ev, post

T0 = datetime(2026, 11, 1, 12, tzinfo=UTC)  # the helpers' checkpoint time
HOURS = 100.0
NODES = ["n0", "n1", "n2", "n3"]  # 8 GPUs, 8 single-port RNICs each, rail r on rail{r}-leaf
UNTIL = T0 + timedelta(hours=HOURS)
NOTIFY = "http://fleet:hunter2@127.0.0.1:9/hook"  # nothing listens: deliveries fail
SECRETS = ("hunter2", "notify-secret-0123456789", "subscription-secret-0123456789")


@pytest.fixture
def filled(db_url: str) -> Iterator[tuple[str, httpx.Client]]:
    """Four nodes registered at T0 and a job on two; over the next hours, on the service's
    clock: four cable faults repaired after an hour, an RNIC dead for two, a flap, a CQE
    burst, and a leaf failure (three nodes of rail 6 within a second) repaired after 30
    minutes."""
    settings = Settings(
        db_url=db_url,
        port=0,
        allow_anonymous_loopback=True,
        webhook_allow_loopback=True,
        coordinator=False,  # swept below, after each move of the clock
        failback_damping_s=60,
        fault_quiet_s=300,
        command_ack_timeout_s=10**6,
        notify_secret=SECRETS[1],
    )
    with service(settings, T0) as (svc, url, clock), httpx.Client(base_url=url) as http:
        register_nodes(http, NODES)
        sub = {"url": NOTIFY, "secret": SECRETS[2]}
        assert http.post("/v1/subscriptions", json=sub).status_code == 201
        body = job_body("train", ["n0", "n1"], notify_url=NOTIFY, dp_size=2, tp_size=8)
        body["communicators"] = [{"comm_id": 7, "channels": 16}]
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text

        def at(hours: float, *events: dict[str, Any]) -> None:
            now = T0 + timedelta(hours=hours)
            clock.advance((now - clock()).total_seconds())
            svc.state.coordinator.sweep()
            post(http, *events)

        for i, (node, rail) in enumerate([("n2", 0), ("n3", 1), ("n2", 2), ("n0", 5)]):
            h = 1 + 5 * i
            at(h, ev(node, "port_down", T0 + timedelta(hours=h), f"mlx5_{rail}"))
            at(h + 1, ev(node, "port_up", T0 + timedelta(hours=h + 1), f"mlx5_{rail}"))
        at(30, ev("n3", "device_fatal", T0 + timedelta(hours=30), "mlx5_4"))
        at(32, ev("n3", "port_up", T0 + timedelta(hours=32), "mlx5_4"))
        flap = T0 + timedelta(hours=40)
        at(40, ev("n1", "port_down", flap, "mlx5_3"))
        at(40.001, ev("n1", "port_up", flap + timedelta(seconds=3), "mlx5_3"))
        at(45, ev("n2", "cqe_error", T0 + timedelta(hours=45), "mlx5_7", wc_status=12))
        leaf = T0 + timedelta(hours=50)
        at(50, *(ev(n, "port_down", leaf + timedelta(seconds=0.3 * i), "mlx5_6")
                 for i, n in enumerate(["n1", "n2", "n3"])))  # fmt: skip
        at(50.5, *(ev(n, "port_up", leaf + timedelta(minutes=30), "mlx5_6")
                   for n in ["n1", "n2", "n3"]))  # fmt: skip
        clock.advance(61)  # the damping period: the ports fail back, the leaf clears
        svc.state.coordinator.sweep()
        yield db_url, http


def export(db_url: str, *args: str) -> Any:
    result = CliRunner().invoke(
        app,
        ["export", "--db", db_url, "--since", T0.isoformat(), "--until", UNTIL.isoformat(), *args],
    )
    assert result.exit_code == 0, result.output
    return result


def test_export_of_a_store_the_service_filled_and_its_fit(
    filled: tuple[str, httpx.Client], tmp_path: Path
) -> None:
    db_url, _ = filled
    out = tmp_path / "history.json"
    export(db_url, "--out", str(out))
    raw = out.read_text()
    assert not [s for s in SECRETS if s in raw]  # no secrets, no notification URL
    assert "127.0.0.1:9" not in raw
    doc = json.loads(raw)
    assert doc["version"] == HISTORY_VERSION
    history = History.model_validate(doc)
    assert [n.name for n in history.nodes] == NODES
    by = {(f.node, f.device): f for f in history.faults}
    assert by[("n2", "mlx5_0")].duration_s == 3600.0
    assert by[("n3", "mlx5_4")].component == "rnic"
    assert [s.switch for s in history.switch_faults] == ["rail6-leaf"]
    assert all(by[(n, "mlx5_6")].switch_fault_id is not None for n in ("n1", "n2", "n3"))
    (job,) = history.jobs
    assert (job.ranks, job.nodes, job.checkpoint_interval_s, job.reload_s) == (16, 2, 3600, 600)
    assert history.decisions and all(d.job_id == "train" for d in history.decisions)
    assert any(d.outcomes for d in history.decisions)

    got = fit(history)
    port_h = len(NODES) * 8 * HOURS
    # Four cables and one RNIC (the leaf's three ports are its failure, the flap a flap).
    assert got.rates["link"].events == 4 and got.rates["rnic"].events == 1
    assert got.rates["flap"].events == 1 and got.rates["cqe"].events == 1
    assert got.rates["link"].exposure_h == pytest.approx(port_h)
    assert got.rates["switch"].exposure_h == pytest.approx(8 * HOURS)
    assert got.rates["switch"].per_h == pytest.approx(1 / (8 * HOURS))
    link = got.figures["link_failure_monthly"]
    assert link.value == pytest.approx(monthly_fraction(5 / port_h))
    assert link.observations == 5
    low, high = poisson_interval(5, port_h)
    assert link.interval == pytest.approx((monthly_fraction(low), monthly_fraction(high)))
    # Repairs: four cables of 1 h, the RNIC of 2 h, and the leaf from its third node's
    # report (0.6 s in) to the end of the damping period after its repair (30 min, 61 s).
    leaf = 1800 + 61 - 0.6
    assert got.figures["repair_h"].value == pytest.approx((4 * 3600 + 7200 + leaf) / 6 / 3600)
    assert got.figures["gpus"].value == 16 and got.figures["reload_h"].value == pytest.approx(1 / 6)
    assert got.figures["k"].value[0] == 1.5
    assert got.figures["nodes_per_switch"].value == len(NODES)
    assert got.missing == {}


def test_an_export_is_bounded_by_its_window(filled: tuple[str, httpx.Client]) -> None:
    """--until before the leaf failure: no switch failure, and exposure ends there."""
    db_url, _ = filled
    result = CliRunner().invoke(
        app,
        ["export", "--db", db_url, "--since", T0.isoformat(), "--until",
         (T0 + timedelta(hours=48)).isoformat()],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    history = History.model_validate_json(result.stdout)
    assert history.switch_faults == []
    assert {f.device for f in history.faults} == {f"mlx5_{r}" for r in (0, 1, 2, 3, 4, 5, 7)}
    assert fit(history).rates["link"].exposure_h == pytest.approx(len(NODES) * 8 * 48)


def test_the_api_exports_what_the_cli_does(filled: tuple[str, httpx.Client]) -> None:
    """GET /v1/history, for a fleet manager without access to the store: the same document
    as `railover export` of the same window, apart from when it was made and the rules:
    the service gives those it runs under, the CLI those of its own settings."""
    db_url, http = filled
    window = {"since": T0.isoformat(), "until": UNTIL.isoformat()}
    r = http.get("/v1/history", params=window)
    assert r.status_code == 200, r.text
    assert not [s for s in SECRETS if s in r.text]
    served = r.json()
    written = json.loads(export(db_url).stdout)
    assert served.pop("exported_at") and written.pop("exported_at")
    assert served.pop("service") == {
        "failback_damping_s": 60.0,
        "fault_quiet_s": 300.0,
        "correlation_window_s": 2.0,
        "policy": "railover",
    }
    assert written.pop("service")["failback_damping_s"] == Settings().failback_damping_s
    assert served == written
    assert [f["device"] for f in served["faults"]][:2] == ["mlx5_0", "mlx5_1"]
    # A window that ends before it starts, or a time that is none, names what is wrong.
    backwards = {"since": UNTIL.isoformat(), "until": T0.isoformat()}
    r = http.get("/v1/history", params=backwards)
    assert r.status_code == 422 and r.json()["detail"].startswith("since: "), r.text
    r = http.get("/v1/history", params={"since": "yesterday"})
    assert r.status_code == 422 and "since" in r.text, r.text
    r = http.get("/v1/history", params={"until": "0.5"})  # not a Unix time: RFC 3339 only
    assert r.status_code == 422 and "RFC 3339" in r.text, r.text
    # Before the first registration: an empty window, not one that ends before it starts.
    early = http.get("/v1/history", params={"until": "2000-01-01T00:00:00Z"}).json()
    assert early["window"]["since"] == early["window"]["until"] and early["faults"] == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "yesterday"], "--since 'yesterday': neither a time nor a duration"),
        (["--since", "2026-02-01", "--until", "2026-01-01"], "is not before --until"),
    ],
)
def test_export_refuses_a_bad_window(args: list[str], says: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    (tmp_path / "x.db").write_bytes(b"")
    result = CliRunner().invoke(app, ["export", "--db", db, *args])
    assert result.exit_code == 2
    assert says in result.output


def test_export_refuses_what_is_not_a_railover_store(tmp_path: Path) -> None:
    missing = CliRunner().invoke(app, ["export", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert missing.exit_code == 2 and "there is no store at" in missing.output
    assert not (tmp_path / "none.db").exists()  # nothing created
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
    result = CliRunner().invoke(app, ["export", "--db", f"sqlite:///{other}"])
    assert result.exit_code == 2
    assert "is not a Railover store" in result.output and "alembic_version" in result.output


def history_with(**changes: Any) -> dict[str, Any]:
    """A small history by hand: two nodes for ten hours, a job, and `changes`."""
    node = {"gpus": 8, "rnics": 8, "ports": 8, "registered_at": T0.isoformat()}
    doc: dict[str, Any] = {
        "version": 1,
        "exported_at": (T0 + timedelta(hours=10)).isoformat(),
        "window": {"since": T0.isoformat(), "until": (T0 + timedelta(hours=10)).isoformat()},
        "service": {
            "failback_damping_s": 120,
            "fault_quiet_s": 600,
            "correlation_window_s": 2,
            "policy": "railover",
        },
        "nodes": [
            node | {"name": f"n{i}", "switches": [f"rail{r}-leaf" for r in range(8)]}
            for i in range(2)
        ],
        "faults": [fault(1, 7200.0), fault(2, 5.0)],
        "switch_faults": [],
        "jobs": [
            {
                "job_id": "j",
                "created_at": T0.isoformat(),
                "ranks": 16,
                "nodes": 2,
                "checkpoint_interval_s": 1800,
                "checkpoint_kind": "full",
                "reload_s": 900,
                "detect_s": 0,
                "timeout_s": 30,
                "declared_k": 1.2,
                "measured_k": None,
                "dp_size": 2,
                "incarnation": 1,
                "mode": "normal",
            }
        ],
        "decisions": [],
    }
    doc.update(changes)
    return doc


def fault(fault_id: int, duration_s: float | None) -> dict[str, Any]:
    opened = T0 + timedelta(hours=fault_id)
    cleared = None if duration_s is None else opened + timedelta(seconds=duration_s)
    return {
        "fault_id": fault_id,
        "node": "n0",
        "device": f"mlx5_{fault_id}",
        "port": 1,
        "kind": "link_down",
        "component": "link",
        "opened_at": opened.isoformat(),
        "cleared_at": None if cleared is None else cleared.isoformat(),
        "resolved_at": None,
        "duration_s": duration_s,
        "switch": "rail1-leaf",
    }  # fmt: skip


SimRun = Callable[..., Any]


@pytest.fixture
def simulate(tmp_path: Path) -> SimRun:
    def run(doc: dict[str, Any], *args: str) -> Any:
        path = tmp_path / "h.json"
        path.write_text(json.dumps(doc))
        return CliRunner(env={"COLUMNS": "200"}).invoke(
            app, ["simulate", "--history", str(path), "--runs", "20", "--hours", "100", *args]
        )

    return run


def test_simulate_refuses_a_figure_the_history_cannot_give(simulate: SimRun) -> None:
    """No switch failure in 80 switch-hours: the switch rate is refused, named, unless
    its flag gives it or --fill-defaults takes the default."""
    refused = simulate(history_with())
    assert refused.exit_code == 2
    assert "--switch-failure-monthly: no switch failure in 80 switch-hours" in refused.output
    assert "--fill-defaults" in refused.output
    given = simulate(history_with(), "--switch-failure-monthly", "0.001", "--json")
    assert given.exit_code == 0, given.output
    doc = json.loads(given.stdout)
    assert doc["parameters"]["switch_failure_monthly"] == 0.001
    assert doc["parameters"]["link_failure_monthly"] == pytest.approx(monthly_fraction(1 / 160))
    assert doc["parameters"]["checkpoint_interval_h"] == 0.5
    assert doc["history"]["parameters"]["k"]["rests_on"] == "1 jobs' declared k"
    filled = simulate(history_with(), "--fill-defaults", "--json")
    assert filled.exit_code == 0, filled.output
    doc = json.loads(filled.stdout)
    assert doc["history"]["parameters"]["switch_failure_monthly"]["source"] == "default"
    assert doc["parameters"]["switch_failure_monthly"] == 0.00051


@pytest.mark.parametrize(
    ("changes", "flag", "says"),
    [
        ({"faults": [fault(2, FLAP_S / 2)]}, "--link-failure-monthly", "no link or RNIC fault"),
        ({"faults": [fault(1, None)]}, "--repair-h", "no link, RNIC or switch fault was repaired"),
        ({"jobs": []}, "--gpus", "the history has no job with ranks"),
    ],
)
def test_each_missing_figure_is_named(
    simulate: SimRun, changes: dict[str, Any], flag: str, says: str
) -> None:
    result = simulate(history_with(**changes), "--switch-failure-monthly", "0.001")
    assert result.exit_code == 2
    assert f"{flag}: {says}" in result.output


def test_simulate_prints_the_fit_before_its_answer(simulate: SimRun) -> None:
    result = simulate(history_with(), "--switch-failure-monthly", "0.001")
    assert result.exit_code == 0, result.output
    for text in ("Fault rates fitted from the history", "Fitted parameters", "95 % interval",
                 "1 link and RNIC faults in 160 port-h", "GPU-hours per policy"):  # fmt: skip
        assert text in result.output


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"version": 2}, "an export of version 2"),
        ({"nodes": []}, "not a `railover export`"),
    ],
)
def test_a_file_that_is_no_export_is_refused(
    simulate: SimRun, doc: dict[str, Any], says: str
) -> None:
    result = simulate(doc)
    assert result.exit_code == 2
    assert "--history: " in result.output and says in result.output

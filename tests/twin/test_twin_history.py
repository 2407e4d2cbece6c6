"""`railover twin --history` (the rates and job mix fitted from an export) and `--plot`
(GPU-hours lost over simulated time per policy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler_svc.cli import app
from scheduler_svc.planning.history import History
from scheduler_svc.planning.params import JobModel
from scheduler_svc.twin.cluster import ClusterSpec, FaultKind, job_mix, node_name, trace
from scheduler_svc.twin.fitted import shapes_of
from tests.planning.test_history import history_with

SMALL = ["--nodes", "4", "--spares", "0", "--days", "0.05", "--policy", "railover"]


def twin(tmp_path: Path, doc: dict[str, Any], *args: str) -> Any:
    path = tmp_path / "history.json"
    path.write_text(json.dumps(doc))
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, ["twin", "--history", str(path), *args])


def test_twin_refuses_a_history_without_a_figure_naming_it(tmp_path: Path) -> None:
    result = twin(tmp_path, history_with(), *SMALL)
    assert result.exit_code == 2
    assert "--history: switch_failure_monthly: no switch failure in 80 switch-hours" in (
        result.output
    )
    assert "--fill-defaults" in result.output


def test_twin_on_a_history_prints_the_fit_and_draws_the_loss(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "loss.png"
    result = twin(tmp_path, history_with(), "--fill-defaults", *SMALL, "--plot", str(png))
    assert result.exit_code == 0, result.output
    for text in ("Fitted parameters", "link 0.00625, flap 0.00625", "GPU-hours lost per policy",
                 f"Plot written to {png}"):  # fmt: skip
        assert text in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_twin_plot_refuses_a_format_it_cannot_write(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["twin", *SMALL, "--plot", str(tmp_path / "loss.gif")])
    assert result.exit_code == 2
    assert "cannot tell the format from the suffix '.gif'" in result.output


def test_fitted_rates_replace_only_the_kinds_they_name() -> None:
    spec = ClusterSpec(nodes=64, spares=4, nodes_per_leaf=16, jobs=2)
    base = trace(spec, JobModel(), 7, 3, 300)
    no_links = trace(spec, JobModel(), 7, 3, 300, per_component_h={FaultKind.LINK: 0.0})
    assert any(f.kind == FaultKind.LINK for f in base)
    assert not any(f.kind == FaultKind.LINK for f in no_links)
    # One CQE burst per link-hour: 512 links for 7 days, about 86,000 of them.
    cqe = trace(spec, JobModel(), 7, 3, 1, per_component_h={FaultKind.CQE: 1.0})
    n = sum(f.kind == FaultKind.CQE for f in cqe)
    assert abs(n - 512 * 168) < 5 * (512 * 168) ** 0.5


def test_the_twin_runs_the_historys_own_jobs_as_many_as_fit() -> None:
    """Newest first, each at its own size and regime; one that does not fit beside the
    others is left out, one larger than every non-spare node runs on all of them, and a
    job without ranks or nodes is none."""
    job = history_with()["jobs"][0]
    jobs = [
        job | {"job_id": "old", "created_at": "2026-10-01T00:00:00Z", "nodes": 3, "ranks": 24},
        job | {"job_id": "empty", "created_at": "2026-10-02T00:00:00Z", "nodes": 2, "ranks": 0},
        job | {"job_id": "nowhere", "created_at": "2026-10-02T00:00:00Z", "nodes": 0, "ranks": 8},
        job | {"job_id": "big", "created_at": "2026-10-03T00:00:00Z", "nodes": 9, "ranks": 72},
        job | {"job_id": "one", "created_at": "2026-10-04T00:00:00Z", "nodes": 1, "ranks": 1,
               "declared_k": None},
        job | {"job_id": "new", "created_at": "2026-10-05T00:00:00Z", "nodes": 4, "ranks": 32,
               "checkpoint_kind": "flowcheck", "checkpoint_interval_s": 2.5,
               "measured_k": 1.4, "reload_s": 300},
    ]  # fmt: skip
    model = JobModel()
    shapes = shapes_of(History.model_validate(history_with(jobs=jobs)), model)
    assert [(s.nodes, s.checkpoint, s.interval_s, s.k) for s in shapes] == [
        (4, "flowcheck", 2.5, 1.4),
        (1, "interval", 1800, model.k[0]),  # neither measured nor declared: the model's
        (9, "interval", 1800, 1.2),
        (3, "interval", 1800, 1.2),
    ]
    spec = ClusterSpec(nodes=10, spares=2, nodes_per_leaf=4, jobs=4, scaling=True)
    laid = job_mix(spec, model, shapes)
    assert [(len(j.nodes), j.checkpoint, j.reload_s) for j in laid] == [
        (4, "flowcheck", 300),
        (1, "interval", 900),
        (3, "interval", 900),
    ]
    assert [j.nodes[0] for j in laid] == [node_name(0), node_name(4), node_name(5)]
    assert all(j.allow_scaling for j in laid)
    alone = job_mix(ClusterSpec(nodes=10, spares=2, nodes_per_leaf=4, jobs=1), model, shapes[2:])
    assert [len(j.nodes) for j in alone] == [8]  # the 9-node job, on all 8 non-spare nodes
    assert not alone[0].allow_scaling


def test_twin_on_a_history_says_which_of_its_jobs_it_runs(tmp_path: Path) -> None:
    job = history_with()["jobs"][0]
    doc = history_with(jobs=[job, job | {"job_id": "k", "nodes": 1, "ranks": 8}])
    result = twin(tmp_path, doc, "--fill-defaults", *SMALL)
    assert result.exit_code == 0, result.output
    assert "the history's jobs the twin runs" in result.output
    assert "on 4 non-spare nodes): 2 of 2: 2 nodes, interval 1800 s" in result.output

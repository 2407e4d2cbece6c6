"""`railover twin --history` (the rates and job mix fitted from an export) and `--plot`
(GPU-hours lost over simulated time per policy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scheduler_svc.cli import app
from scheduler_svc.planning.params import JobModel
from scheduler_svc.twin.cluster import ClusterSpec, FaultKind, trace
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

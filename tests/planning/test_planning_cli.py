"""The fixed command-line and JSON interface of simulate, analytic and mirror-plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from scheduler_svc.planning.cli import register
from scheduler_svc.planning.simulate import POLICIES, simulate
from tests.scheduler_svc.helpers import job_body, register_nodes

SMALL = ["--gpus", "1024", "--hours", "100", "--runs", "200", "--seed", "3"]
QUANTS = {"median", "p90", "p99"}


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def run(app: typer.Typer, *args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "120"})


def run_json(app: typer.Typer, *args: str) -> dict[str, Any]:
    result = run(app, *args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_register_adds_the_three_commands(app: typer.Typer) -> None:
    names = {cmd.name for cmd in app.registered_commands}
    assert names == {"simulate", "analytic", "mirror-plan"}


def test_simulate_json_shape(app: typer.Typer) -> None:
    doc = run_json(app, "simulate", *SMALL)
    assert set(doc) == {"parameters", "policies", "reductions", "runtime_s"}
    assert set(doc["policies"]) == set(POLICIES)
    for body in doc["policies"].values():
        assert set(body) == {
            "mean_gpu_hours",
            "ci95_gpu_hours",
            "mean_extra_gpu_hours",
            "gpu_hours",
            "extra_gpu_hours",
        }
        assert set(body["gpu_hours"]) == QUANTS
        assert set(body["extra_gpu_hours"]) == QUANTS
        assert body["ci95_gpu_hours"] >= 0
    restart = doc["policies"]["restart"]
    assert restart["mean_extra_gpu_hours"] == pytest.approx(
        restart["mean_gpu_hours"] - doc["policies"]["fault_free"]["mean_gpu_hours"]
    )
    assert doc["parameters"]["gpus"] == 1024
    assert doc["parameters"]["runs"] == 200
    assert doc["parameters"]["k"] == [1.03, 1.2, 1.5]
    assert set(doc["reductions"]["failover"]) == {"vs_restart", "vs_restart_scaling"}
    assert isinstance(doc["runtime_s"], float)
    assert doc["policies"]["fault_free"]["extra_gpu_hours"]["p99"] == 0.0


def test_simulate_defaults_are_the_papers_setup(app: typer.Typer) -> None:
    doc = run_json(app, "simulate", "--runs", "1")
    params = doc["parameters"]
    expected = {
        "gpus": 16384,
        "hours": 1925.0,
        "link_failure_monthly": 0.00057,
        "switch_failure_monthly": 0.00051,
        "checkpoint_interval_h": 1.0,
        "detect_h": 0.5,
        "reload_h": 0.5,
        "dp": 16,
        "node_replace_h": 24.0,
    }
    assert {key: params[key] for key in expected} == expected


def test_simulate_table_prints_parameters_and_every_policy(app: typer.Typer) -> None:
    result = run(app, "simulate", *SMALL)
    assert result.exit_code == 0, result.output
    assert "Parameters" in result.output
    assert "link_failure_monthly" in result.output
    for policy in POLICIES:
        assert policy in result.output


def test_analytic_json_shape(app: typer.Typer) -> None:
    doc = run_json(app, "analytic", "--gpus", "1024,4096")
    assert set(doc) == {"parameters", "results"}
    assert [row["gpus"] for row in doc["results"]] == [1024, 4096]
    hours = doc["parameters"]["hours"]
    for row in doc["results"]:
        assert set(row) == {
            "gpus",
            "expected_faults",
            "restart_hours",
            "failover_hours",
            "restart_extra_hours",
            "failover_extra_hours",
            "improvement",
            "extra_saved",
        }
        assert row["failover_hours"] <= row["restart_hours"]
        assert row["improvement"] == pytest.approx(1 - row["failover_hours"] / row["restart_hours"])
        assert row["restart_extra_hours"] == pytest.approx(row["restart_hours"] - hours)
        assert row["extra_saved"] == pytest.approx(
            1 - row["failover_extra_hours"] / row["restart_extra_hours"]
        )
        assert row["expected_faults"] > 0
    assert doc["parameters"]["gpus"] == [1024, 4096]


def test_analytic_table(app: typer.Typer) -> None:
    result = run(app, "analytic", "--gpus", "1024,65536", "--runs", "100")
    assert result.exit_code == 0, result.output
    assert "65,536" in result.output
    assert "Monte Carlo check" in result.output


def test_mirror_plan_json_shape(app: typer.Typer) -> None:
    doc = run_json(app, "mirror-plan", "--loss", "1e-9", "--dp", "8", "--packets", "50000")
    assert set(doc) == {
        "parameters",
        "p_fail",
        "failed_per_year",
        "recommended_monitors",
        "placement",
    }
    assert list(doc["failed_per_year"]) == list(doc["p_fail"])
    per_year = doc["parameters"]["iterations_per_year"]
    assert doc["failed_per_year"]["2"] == pytest.approx(doc["p_fail"]["2"] * per_year)
    assert list(doc["p_fail"]) == [str(m) for m in range(1, 9)]
    assert doc["p_fail"]["3"] > 0.0  # far below 1e-16, still not cancelled to zero
    assert isinstance(doc["recommended_monitors"], int)
    assert len(doc["placement"]) == doc["recommended_monitors"]
    assert set(doc["placement"][0]) == {"rank", "rail", "switch", "shares_switch"}
    assert doc["parameters"]["loss"] == 1e-9


def test_mirror_plan_table(app: typer.Typer) -> None:
    result = run(app, "mirror-plan", "--loss", "1e-6", "--dp", "16", "--packets", "100000")
    assert result.exit_code == 0, result.output
    assert "recommended" in result.output
    assert "Where to mirror" in result.output


def test_yaml_config_is_read_and_flags_override_it(app: typer.Typer, tmp_path: Path) -> None:
    study = tmp_path / "study.yaml"
    study.write_text("gpus: 2048\nhours: 50\nruns: 100\nk: [1.1, 1.3]\nrepair_h: 3\n")
    doc = run_json(app, "simulate", "--config", str(study), "--hours", "60")
    params = doc["parameters"]
    assert params["gpus"] == 2048
    assert params["hours"] == 60.0
    assert params["k"] == [1.1, 1.3]
    assert params["repair_h"] == 3.0
    assert params["runs"] == 100


def test_yaml_config_feeds_analytic_and_mirror_plan(app: typer.Typer, tmp_path: Path) -> None:
    study = tmp_path / "a.yaml"
    study.write_text("gpus: 1024,2048\nk: '1.05,1.3'\n")
    doc = run_json(app, "analytic", "--config", str(study))
    assert [row["gpus"] for row in doc["results"]] == [1024, 2048]
    plan = tmp_path / "m.yaml"
    plan.write_text("loss: 1.0e-5\ndp: 4\npackets: 1000\n")
    assert run_json(app, "mirror-plan", "--config", str(plan))["parameters"]["dp"] == 4


@pytest.mark.parametrize("command", ["simulate", "analytic", "mirror-plan"])
def test_unknown_yaml_key_is_an_error_naming_it(
    app: typer.Typer, tmp_path: Path, command: str
) -> None:
    study = tmp_path / "bad.yaml"
    study.write_text("gpu_count: 10\n")
    result = run(app, command, "--config", str(study))
    assert result.exit_code == 2
    assert "gpu_count" in result.output


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["simulate", "--link-failure-monthly", "-0.1"], "--link-failure-monthly"),
        (["simulate", "--switch-failure-monthly", "1.5"], "--switch-failure-monthly"),
        (["simulate", "--k", "1.03,0.5"], "--k"),
        (["simulate", "--k", "fast"], "--k"),
        (["simulate", "--gpus", "1001"], "--gpus"),
        (["simulate", "--runs", "0"], "--runs"),
        (["simulate", "--dp", "3"], "--dp"),
        (["simulate", "--checkpoint", "weekly"], "--checkpoint"),
        (["simulate", "--detect-h", "-1"], "--detect-h"),
        (["analytic", "--gpus", "1024,1001"], "--gpus"),
        (["analytic", "--checkpoint-interval-h", "0"], "--checkpoint-interval-h"),
        (["mirror-plan", "--loss", "1.5"], "--loss"),
        (["mirror-plan", "--dp", "1"], "--dp"),
        (["mirror-plan", "--packets", "0"], "--packets"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(app: typer.Typer, args: list[str], flag: str) -> None:
    result = run(app, *args)
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_bad_value_in_yaml_names_the_flag(app: typer.Typer, tmp_path: Path) -> None:
    study = tmp_path / "bad.yaml"
    study.write_text("k: [1.0, 0.8]\n")
    result = run(app, "simulate", "--config", str(study))
    assert result.exit_code == 2
    assert "--k" in result.output


def test_simulate_json_carries_every_number_of_the_table(app: typer.Typer) -> None:
    """The table's headline column, mean ± 95 % CI, is in the JSON with the same digits."""
    doc = run_json(app, "simulate", *SMALL)
    table = run(app, "simulate", *SMALL).output
    for body in doc["policies"].values():
        shown = f"{body['mean_gpu_hours'] / 1e6:.4f} ± {body['ci95_gpu_hours'] / 1e6:.4f}"
        assert shown in table


def test_analytic_json_carries_every_number_of_the_table(app: typer.Typer) -> None:
    doc = run_json(app, "analytic", "--gpus", "1024,65536")
    table = run(app, "analytic", "--gpus", "1024,65536").output
    for row in doc["results"]:
        for cell in (
            f"{row['expected_faults']:.1f}",
            f"{row['restart_extra_hours']:.2f}",
            f"{row['failover_extra_hours']:.2f}",
            f"{row['extra_saved']:.1%}",
        ):
            assert cell in table, cell


def test_mirror_plan_summarises_a_large_ring_unless_all(app: typer.Typer) -> None:
    args = ["mirror-plan", "--dp", "5000", "--loss", "1e-6"]
    short = run(app, *args).output
    assert short.count("\n") < 80, short
    assert "rows left out (--all)" in short
    assert "◀ recommended" in short
    assert " 5000 " in short  # the last row stays
    whole = run(app, *args, "--all").output
    assert "rows left out" not in whole
    assert whole.count("\n") > 5000
    assert len(run_json(app, *args)["p_fail"]) == 5000


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")]
)
def test_plot_writes_the_format_its_suffix_names(
    app: typer.Typer, tmp_path: Path, suffix: str, magic: bytes
) -> None:
    out = tmp_path / f"cdf{suffix}"
    result = run(
        app,
        "simulate",
        "--gpus",
        "64",
        "--dp",
        "2",
        "--hours",
        "10",
        "--runs",
        "20",
        "--plot",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(magic)
    if suffix == ".svg":
        assert b"<svg" in out.read_bytes()[:2000]


def test_plot_path_is_checked_before_the_run(app: typer.Typer, tmp_path: Path) -> None:
    result = run(app, "simulate", "--runs", "5000000", "--plot", str(tmp_path / "no" / "x.png"))
    assert result.exit_code == 2
    assert "does not exist" in result.stderr
    assert result.stdout == ""


def test_plot_writes_a_png(app: typer.Typer, tmp_path: Path) -> None:
    out = tmp_path / "cdf.png"
    result = run(app, "simulate", *SMALL, "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[0] >= 400
    assert pixels.shape[1] >= 600


def test_plot_has_labelled_axes_a_legend_and_one_line_per_policy() -> None:
    import matplotlib.pyplot as plt

    from scheduler_svc.planning.params import JobModel
    from scheduler_svc.planning.plot import cdf_figure

    result = simulate(JobModel(gpus=1024, hours=100.0), 100, seed=1)
    fig = cdf_figure(result)
    ax = fig.axes[0]
    assert "GPU·h" in ax.get_xlabel()
    assert "runs" in ax.get_ylabel()
    assert len(ax.get_lines()) == len(POLICIES)
    legend = ax.get_legend()
    assert legend is not None
    assert len(legend.get_texts()) == len(POLICIES)
    plt.close(fig)


def test_matplotlib_is_not_imported_without_plot(tmp_path: Path) -> None:
    script = (
        "import sys, typer\n"
        "from typer.testing import CliRunner\n"
        "from scheduler_svc.planning.cli import register\n"
        "app = typer.Typer(); register(app)\n"
        "r = CliRunner().invoke(app, ['simulate', '--gpus', '64', '--dp', '2', '--hours', '10',"
        " '--runs', '10', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "assert 'matplotlib' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path, timeout=120)


def test_mirror_plan_for_a_registered_job_reads_its_real_ring(
    app: typer.Typer, service: str, http: httpx.Client
) -> None:
    """DP 8 × TP 4 on four 8-GPU nodes: the DP ring is ranks 0, 4, ..., 28, i.e. GPUs 0 and 4
    of every node, so it leaves on two rails only, not on the eight the invented layout
    stripes a ring of 8 over."""
    nodes = ["n0", "n1", "n2", "n3"]
    register_nodes(http, nodes)
    r = http.post("/v1/jobs", json=job_body("big", nodes, dp_size=8, tp_size=4))
    assert r.status_code == 201, r.text
    paths = {p["rank"]: p for p in http.get("/v1/jobs/big/paths").json()["ranks"]}
    args = ["--loss", "1e-4", "--packets", "100000"]
    doc = run_json(app, "mirror-plan", "--job", "big", "--url", service, *args)
    ring = [4 * d for d in range(8)]
    assert doc["job"] == {
        "job_id": "big",
        "dp": 8,
        "tp": 4,
        "pp": 1,
        "ring": [
            {
                "rank": r,
                "node": nodes[r // 8],
                "rnic": paths[r]["primary"],
                "rail": r % 8,
                "switch": f"rail{r % 8}-leaf",
            }
            for r in ring
        ],
    }
    assert [paths[r]["primary"] for r in ring] == ["mlx5_0/1", "mlx5_4/1"] * 4
    assert doc["parameters"]["dp"] == 8
    assert "rails" not in doc["parameters"]
    placement = doc["placement"]
    m = doc["recommended_monitors"]
    assert m == len(placement) and m >= 3  # more monitors than the ring has switches
    for mon in placement:
        assert mon["job_rank"] == ring[mon["rank"]]
        assert (mon["node"], mon["rnic"]) == (
            nodes[mon["job_rank"] // 8],
            paths[mon["job_rank"]]["primary"],
        )
        assert mon["switch"] == f"rail{mon['rail']}-leaf"
    # The ring has two switches: four monitors share them evenly, two on each.
    assert [(mon["rank"], mon["job_rank"], mon["switch"]) for mon in placement] == [
        (0, 0, "rail0-leaf"),
        (1, 4, "rail4-leaf"),
        (4, 16, "rail0-leaf"),
        (5, 20, "rail4-leaf"),
    ]
    assert all(mon["shares_switch"] for mon in placement)
    # The invented layout for the same N would have put every monitor on a switch of its own.
    invented = run_json(app, "mirror-plan", "--dp", "8", "--rails", "8", *args)
    assert invented["recommended_monitors"] == m
    assert not any(mon["shares_switch"] for mon in invented["placement"])
    table = run(app, "mirror-plan", "--job", "big", "--url", service, *args)
    assert table.exit_code == 0, table.output
    assert "Where to mirror job big" in table.output


def test_mirror_plan_job_errors_name_the_flag(
    app: typer.Typer, service: str, http: httpx.Client
) -> None:
    missing = run(app, "mirror-plan", "--job", "nope", "--url", service)
    assert missing.exit_code == 2
    assert "--job" in missing.output and "404" in missing.output
    both = run(app, "mirror-plan", "--job", "nope", "--url", service, "--dp", "8")
    assert both.exit_code == 2 and "--dp" in both.output
    register_nodes(http, ["n0"])
    assert http.post("/v1/jobs", json=job_body("solo", ["n0"])).status_code == 201
    solo = run(app, "mirror-plan", "--job", "solo", "--url", service)  # dp_size 1
    assert solo.exit_code == 2 and "dp" in solo.output

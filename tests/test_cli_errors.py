"""Expected failures of the real console scripts: two lines, problem then fix, exit 2.

Each case runs `railover` or `railover-agent` as a subprocess, as a user would, and
checks the whole of stderr: no traceback, the line count, and that the message names
what is wrong. Tracebacks are for bugs, and for `--debug`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
RAILOVER = BIN / "railover"
AGENT = BIN / "railover-agent"
REPO = Path(__file__).resolve().parents[1]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
    env.update({"HOME": str(tmp), "COLUMNS": "200", **extra})
    return env


def run(program: Path, *args: str, tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(program), *args],
        cwd=tmp,
        env=_env(tmp, **env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused(result: subprocess.CompletedProcess[str], *needles: str, lines: int = 2) -> str:
    """Exit 2, no traceback, exactly `lines` lines on stderr, each needle in them."""
    err = result.stderr
    assert result.returncode == 2, (result.returncode, err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    assert len(err.strip().splitlines()) == lines, err
    for needle in needles:
        assert needle in err, err
    assert err.splitlines()[-1].lstrip().startswith("fix:"), err
    return err


@pytest.fixture
def listening() -> Iterator[int]:
    """A port some other program already listens on."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield int(sock.getsockname()[1])


# --- the store ----------------------------------------------------------------------


def test_mysql_is_not_a_supported_store(tmp_path: Path) -> None:
    r = run(RAILOVER, "serve", "--db", "mysql://u@db/railover", tmp=tmp_path)
    refused(r, "--db", "only SQLite", "PostgreSQL")


def test_in_memory_sqlite_is_refused(tmp_path: Path) -> None:
    r = run(RAILOVER, "token", "create", "--role", "fleet", "--db", "sqlite://", tmp=tmp_path)
    refused(r, "in-memory", "sqlite:///path")


def test_sqlite_in_a_missing_folder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/no/such/dir/r.db"
    r = run(RAILOVER, "db", "upgrade", "--db", url, tmp=tmp_path)
    refused(r, "does not exist", str(tmp_path / "no/such/dir"), "mkdir -p")
    assert not (tmp_path / "no").exists()


def test_the_readme_postgres_url_unreachable(tmp_path: Path) -> None:
    r = run(RAILOVER, "token", "list", "--db", "postgresql://railover@db/railover", tmp=tmp_path)
    refused(r, "postgresql://railover@db/railover", "cannot be reached", "RAILOVER_DB_URL")


def test_postgres_refusing_connections(tmp_path: Path) -> None:
    url = "postgresql://railover:hunter2@127.0.0.1:1/railover"
    r = run(RAILOVER, "serve", tmp=tmp_path, RAILOVER_DB_URL=url)
    err = refused(r, "127.0.0.1:1", "cannot be reached")
    assert "hunter2" not in err  # the password is never echoed


# --- settings -----------------------------------------------------------------------


def test_port_out_of_range(tmp_path: Path) -> None:
    r = run(RAILOVER, "serve", "--port", "70000", tmp=tmp_path)
    refused(r, "--port", "RAILOVER_PORT", "65535")


def test_port_not_a_number(tmp_path: Path) -> None:
    r = run(RAILOVER, "serve", tmp=tmp_path, RAILOVER_PORT="abc")
    refused(r, "RAILOVER_PORT=abc", "integer", "railover config")


def test_duration_with_a_unit(tmp_path: Path) -> None:
    r = run(RAILOVER, "serve", tmp=tmp_path, RAILOVER_FAILBACK_DAMPING_S="2m")
    refused(r, "RAILOVER_FAILBACK_DAMPING_S=2m", "number")


def test_list_setting_with_a_bad_entry(tmp_path: Path) -> None:
    r = run(RAILOVER, "db", "upgrade", tmp=tmp_path, RAILOVER_DEFAULT_K="1.2,fast")
    refused(r, "RAILOVER_DEFAULT_K", "number")


def test_list_setting_as_a_comma_list_is_taken(tmp_path: Path) -> None:
    r = run(RAILOVER, "db", "upgrade", tmp=tmp_path, RAILOVER_DEFAULT_K="1.2,1.5")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "railover.db").exists()


def test_misspelt_variable_is_a_warning_with_the_nearest_name(tmp_path: Path) -> None:
    r = run(RAILOVER, "db", "upgrade", tmp=tmp_path, RAILOVER_COMMAND_MAX_ATTEMPT="5")
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1, r.stderr
    assert "RAILOVER_COMMAND_MAX_ATTEMPT is not a setting" in warning[0]
    assert "did you mean RAILOVER_COMMAND_MAX_ATTEMPTS?" in warning[0]


def test_other_programs_variables_are_not_warned_about(tmp_path: Path) -> None:
    r = run(
        RAILOVER,
        "db",
        "upgrade",
        tmp=tmp_path,
        RAILOVER_AGENT_NODE_NAME="n1",
        RAILOVER_PLUGIN_SOCKET="/tmp/x",
        RAILOVER_URL="http://127.0.0.1:8080",
    )
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr


# --- ports --------------------------------------------------------------------------


def test_serve_port_in_use(tmp_path: Path, listening: int) -> None:
    r = run(RAILOVER, "serve", "--port", str(listening), tmp=tmp_path)
    refused(r, f"port {listening}", "in use", "--port")


def test_agent_metrics_port_in_use(tmp_path: Path, listening: int) -> None:
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    r = run(
        AGENT,
        tmp=tmp_path,
        RAILOVER_AGENT_SYSFS_ROOT=str(sysfs),
        RAILOVER_AGENT_SPOOL_DIR=str(tmp_path / "spool"),
        RAILOVER_AGENT_SOCKET=str(tmp_path / "run" / "agent.sock"),
        RAILOVER_AGENT_METRICS_HOST="127.0.0.1",
        RAILOVER_AGENT_METRICS_PORT=str(listening),
    )
    refused(r, f"metrics port 127.0.0.1:{listening}", "in use", "RAILOVER_AGENT_METRICS_PORT")
    assert not (tmp_path / "spool").exists()


def test_agent_invalid_setting(tmp_path: Path) -> None:
    r = run(AGENT, tmp=tmp_path, RAILOVER_AGENT_POLL_INTERVAL_S="1s")
    refused(r, "RAILOVER_AGENT_POLL_INTERVAL_S", "number")


def test_agent_misspelt_variable_warns(tmp_path: Path) -> None:
    # The invalid sysfs root stops it right after the warning.
    r = run(
        AGENT,
        tmp=tmp_path,
        RAILOVER_AGENT_SYSFS_ROOT=str(tmp_path / "missing"),
        RAILOVER_AGENT_SPOOLDIR="/tmp/x",
    )
    assert "RAILOVER_AGENT_SPOOLDIR is not a setting" in r.stderr
    assert "did you mean RAILOVER_AGENT_SPOOL_DIR?" in r.stderr


# --- output paths -------------------------------------------------------------------


def test_plot_into_a_missing_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "missing" / "cdf.png"
    # A run this size takes minutes: refusing in a second shows the check comes first.
    r = run(RAILOVER, "simulate", "--runs", "5000000", "--plot", str(out), tmp=tmp_path)
    refused(r, "--plot", "does not exist", "mkdir -p")
    assert r.stdout == ""


def test_plot_with_an_unknown_suffix(tmp_path: Path) -> None:
    r = run(RAILOVER, "simulate", "--runs", "10", "--plot", str(tmp_path / "cdf.gif"), tmp=tmp_path)
    refused(r, "'.gif'", ".png, .svg, .pdf")


# --- --debug ------------------------------------------------------------------------


def test_bad_planning_value_is_two_lines_naming_the_flag(tmp_path: Path) -> None:
    r = run(RAILOVER, "analytic", "--k", "1.2,0.5", tmp=tmp_path)
    refused(r, "--k", "0.5", "railover analytic --help")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    r = run(RAILOVER, "--debug", "serve", "--db", "mysql://u@db/x", tmp=tmp_path)
    assert r.returncode == 2
    assert "Traceback" in r.stderr
    assert "ValidationError" in r.stderr
    assert r.stderr.splitlines()[-1].startswith("  fix:")
    store = run(
        RAILOVER, "--debug", "db", "upgrade", "--db", "postgresql://u@127.0.0.1:1/x", tmp=tmp_path
    )
    assert "Traceback" in store.stderr and "OperationalError" in store.stderr


def test_demo_without_the_plugin_built(tmp_path: Path) -> None:
    """`make demo`'s command, run from the checkout as the Makefile runs it."""
    r = subprocess.run(
        [str(BIN / "python"), "-m", "railover_testing.demo"],
        cwd=REPO,
        env=_env(tmp_path, RAILOVER_PLUGIN_LIB=str(tmp_path / "missing.so")),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    refused(r, "missing.so", "is not built", "make -C native_plugin")


def test_the_product_cli_has_no_demo(tmp_path: Path) -> None:
    """The demo is built from the test support, which the wheel does not ship."""
    r = run(RAILOVER, "demo", tmp=tmp_path)
    assert r.returncode == 2
    assert "No such command 'demo'" in r.stderr


def test_agent_bad_log_level(tmp_path: Path) -> None:
    r = run(AGENT, tmp=tmp_path, RAILOVER_AGENT_LOG_LEVEL="verbose")
    refused(r, "RAILOVER_AGENT_LOG_LEVEL", "DEBUG")


def test_service_bad_log_level(tmp_path: Path) -> None:
    r = run(RAILOVER, "serve", tmp=tmp_path, RAILOVER_LOG_LEVEL="verbose")
    refused(r, "RAILOVER_LOG_LEVEL=VERBOSE", "DEBUG")

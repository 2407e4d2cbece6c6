"""The `railover` command line: tokens and the serve safety check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from scheduler_svc.cli import app


def test_token_create_list_revoke(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    runner = CliRunner()
    r = runner.invoke(app, ["token", "create", "--role", "agent", "--node", "n0", "--db", db])
    assert r.exit_code == 0, r.output
    token = r.stdout.strip().splitlines()[-1]
    assert token.startswith("rvr_")
    listing = runner.invoke(app, ["token", "list", "--db", db])
    token_id = token.split("_")[1]
    assert f"{token_id}\tagent\tn0\tactive" in listing.stdout
    assert runner.invoke(app, ["token", "revoke", token_id, "--db", db]).exit_code == 0
    assert "revoked" in runner.invoke(app, ["token", "list", "--db", db]).stdout
    assert runner.invoke(app, ["token", "revoke", token_id, "--db", db]).exit_code == 1


def test_agent_token_needs_node(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        app, ["token", "create", "--role", "agent", "--db", f"sqlite:///{tmp_path / 'r.db'}"]
    )
    assert r.exit_code == 2
    assert "--node is required" in r.output


def test_serve_refuses_routable_address_without_tokens(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler_svc",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--db",
            f"sqlite:///{tmp_path / 'r.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "refusing to listen on 0.0.0.0" in proc.stderr

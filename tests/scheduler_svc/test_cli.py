"""The `railover` command line: tokens, the serve safety check, --help, --version, /docs."""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import subprocess
import sys
import weakref
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import scheduler_svc
from railover_testing.local import local_service
from scheduler_svc.cli import app
from scheduler_svc.config import Settings


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


BIN = Path(sys.executable).parent


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
    env.update({"HOME": str(home), "COLUMNS": "120"})
    return env


def _run(*argv: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=cwd,
        env={**_clean_env(cwd), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_version_is_the_package_version_everywhere(tmp_path: Path) -> None:
    expected = version("railover")
    assert scheduler_svc.__version__ == expected
    assert _run("railover", "--version", cwd=tmp_path).stdout.strip() == f"railover {expected}"
    agent = _run("railover-agent", "--version", cwd=tmp_path)
    assert agent.returncode == 0 and agent.stdout.strip() == f"railover-agent {expected}"
    committed = json.loads((Path(__file__).parents[2] / "openapi/openapi.json").read_text())
    assert committed["info"]["version"] == expected
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'r.db'}", port=0, allow_anonymous_loopback=True
    )
    with local_service(settings) as url, httpx.Client(base_url=url) as http:
        assert http.get("/openapi.json").json()["info"]["version"] == expected
        assert http.get("/healthz").json()["detail"]["version"] == expected
    assert not list(tmp_path.glob("railover.db"))  # --version opened no store


@pytest.mark.parametrize(
    "argv",
    [
        ["railover", "--help"],
        ["railover", "serve", "--help"],
        ["railover", "token", "create", "--help"],
        ["railover", "db", "upgrade", "--help"],
        ["railover", "config", "--help"],
        ["railover", "simulate", "--help"],
        ["railover", "analytic", "--help"],
        ["railover", "mirror-plan", "--help"],
    ],
    ids=lambda a: " ".join(a[1:]),
)
def test_help_does_nothing_else(argv: list[str], tmp_path: Path) -> None:
    r = _run(*argv, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout
    assert list(tmp_path.iterdir()) == []  # no store, no output file


def test_agent_help_creates_nothing_and_opens_no_port(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    spool, sock = tmp_path / "spool", tmp_path / "run" / "agent.sock"
    # The metrics port is taken: an agent that tried to start would fail on it.
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        r = _run(
            "railover-agent",
            "--help",
            cwd=home,
            RAILOVER_AGENT_SPOOL_DIR=str(spool),
            RAILOVER_AGENT_SOCKET=str(sock),
            RAILOVER_AGENT_METRICS_HOST="127.0.0.1",
            RAILOVER_AGENT_METRICS_PORT=str(port),
        )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: railover-agent")
    assert "RAILOVER_AGENT_SERVICE_URL" in r.stdout
    assert r.stderr == ""
    assert not spool.exists() and not sock.parent.exists()
    assert list(home.iterdir()) == []


def test_analytic_help_lists_only_options_it_accepts() -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["analytic", "--help"], env={"COLUMNS": "200"}).stdout
    options = sorted(set(re.findall(r"(--[a-z][a-z0-9-]+)", shown)) - {"--help", "--json"})
    assert "--dp" not in options and "--gpus" in options
    for option in options:
        probe = runner.invoke(app, ["analytic", option, "--help"])
        assert "No such option" not in probe.output, (option, probe.output)


def test_docs_are_served_from_the_package_with_no_cdn(tmp_path: Path) -> None:
    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'r.db'}", port=0, allow_anonymous_loopback=True
    )
    with local_service(settings) as url, httpx.Client(base_url=url) as http:
        for page in ("/docs", "/redoc"):
            html = http.get(page)
            assert html.status_code == 200
            assert not re.findall(r"https?://", html.text), html.text
            refs = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", html.text)
            assert refs and all(ref.startswith("/") for ref in refs), refs
            for ref in refs:
                asset = http.get(ref)
                assert asset.status_code == 200, ref
                assert len(asset.content) > 100, ref
        bundle = http.get("/docs/assets/swagger-ui-bundle.js")
        assert "javascript" in bundle.headers["content-type"]


def test_serve_parses_http_with_httptools(tmp_path: Path) -> None:
    """pyproject.toml installs httptools, and `serve` takes it, guarded, over the
    pure-Python h11 (a fifth of an idle renewal's CPU was h11's)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from scheduler_svc.main import create_app
    from scheduler_svc.serving import GuardedHttpToolsProtocol, server_config

    settings = Settings(db_url=f"sqlite:///{tmp_path / 'r.db'}")
    config = server_config(create_app(settings), settings)
    config.load()
    assert issubclass(config.http_protocol_class, GuardedHttpToolsProtocol)
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)


def test_a_first_serve_without_tokens_says_how_to_create_one(tmp_path: Path) -> None:
    """Anonymous access is not open unless asked for (--dev): every request is a 401, and
    the start says so with the command that makes a token."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_svc", "serve", "--port", "0", "--db",
         f"sqlite:///{tmp_path / 'r.db'}"],
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "no API tokens exist" in line:
                break
        assert "railover token create --role fleet" in seen[-1], seen
        assert "refused with 401" in seen[-1]
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_stopped_service_is_freed_with_its_store(tmp_path: Path) -> None:
    """The twin and the tests run many services in one process: once one has stopped,
    nothing of the process may keep its app, and with it its store engine and caches.
    (An endpoint that closed over its app was kept by FastAPI's process-wide cache.)"""
    from scheduler_svc.main import create_app
    from scheduler_svc.twin.inprocess import served_app

    settings = Settings(
        db_url=f"sqlite:///{tmp_path / 'r.db'}", port=0, allow_anonymous_loopback=True
    )
    service = create_app(settings)
    with served_app(service) as url, httpx.Client(base_url=url) as http:
        for page in ("/docs", "/redoc", "/openapi.json", "/v1/nodes", "/readyz"):
            assert http.get(page).status_code == 200, page
        engine = weakref.ref(service.state.engine)
    freed = weakref.ref(service)
    del service
    gc.collect()
    assert freed() is None, [type(r).__name__ for r in gc.get_referrers(freed())]
    assert engine() is None

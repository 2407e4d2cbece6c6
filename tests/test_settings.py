"""Settings in one place: described, listed by `railover config`, the README generated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from agent.config import AgentSettings
from agent.config import unknown_variables as agent_unknown
from scheduler_svc import config
from scheduler_svc.config import Settings, service_variable_warnings
from scheduler_svc.settings_env import env_names

REPO = Path(__file__).resolve().parents[1]
RAILOVER = Path(sys.executable).with_name("railover")
CLASSES: list[type[BaseSettings]] = [Settings, AgentSettings]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_setting_has_a_description(cls: type[BaseSettings]) -> None:
    missing = [name for name, f in cls.model_fields.items() if not (f.description or "").strip()]
    assert not missing, f"give these fields a description=...: {missing}"


def test_the_readme_table_is_generated_from_the_settings_classes() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme == config.splice(readme), (
        "README.md's settings table is out of date: run "
        "`.venv/bin/python -m scheduler_svc.config README.md`"
    )
    for cls in CLASSES:
        for var in env_names(cls):
            assert f"| `{var}` |" in readme


def test_a_new_field_appears_in_the_docs_without_further_edits() -> None:
    class Extra(Settings):
        fault_quiet_s: float = 3.0

    rows = {d.variable: d for d in config.describe(Extra)}
    assert rows["RAILOVER_FAULT_QUIET_S"].default == "3"
    assert rows["RAILOVER_FAULT_QUIET_S"].type == "float"


def test_types_and_defaults_read_as_a_person_writes_them() -> None:
    rows = {d.variable: d for d in config.describe(Settings)}
    assert rows["RAILOVER_PORT"].type == "int ≥ 0, ≤ 65535"
    assert rows["RAILOVER_PORT"].default == "8080"
    assert rows["RAILOVER_DEFAULT_K"].type == "list of float"
    assert rows["RAILOVER_DEFAULT_K"].default == "1.03,1.2,1.5"
    assert rows["RAILOVER_NOTIFY_SECRET"].type == "secret"
    assert rows["RAILOVER_NOTIFY_SECRET"].default == "unset"
    assert rows["RAILOVER_K8S_NODE_POLICY"].type.startswith("one of condition, taint")
    agent = {d.variable: d for d in config.describe(AgentSettings)}
    # Never this machine's host name: the README must not change from machine to machine.
    assert agent["RAILOVER_AGENT_NODE_NAME"].default == "short host name"
    assert agent["RAILOVER_AGENT_SOCKET_MODE"].default == "0o660"


def test_railover_config_lists_every_variable(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAILOVER_")}
    r = subprocess.run(
        [str(RAILOVER), "config"], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    )
    for cls in CLASSES:
        for doc in config.describe(cls):
            assert f"{doc.variable}  {doc.type}  [{doc.default}]" in r.stdout
            assert doc.meaning in r.stdout
    md = subprocess.run(
        [str(RAILOVER), "config", "--markdown"], capture_output=True, text=True, env=env, check=True
    )
    assert md.stdout == config.markdown()


@pytest.mark.parametrize("value", ["1.2,1.5", " 1.2 , 1.5 ", "[1.2, 1.5]"])
def test_list_settings_take_commas_or_json(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILOVER_DEFAULT_K", value)
    assert Settings().default_k == (1.2, 1.5)


def test_agent_list_settings_take_json_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAILOVER_AGENT_SYSFS_ROOT", str(tmp_path))
    monkeypatch.setenv("RAILOVER_AGENT_COUNTER_EVENTS", '["link_downed", "symbol_error"]')
    assert AgentSettings().counter_events == ["link_downed", "symbol_error"]


def test_a_broken_json_list_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILOVER_DEFAULT_K", "[1.2, 1.5")
    with pytest.raises(ValidationError, match="not a JSON list"):
        Settings()


def test_unknown_variables_get_the_nearest_name() -> None:
    env = {
        "RAILOVER_FLAP_MAXX": "3",
        "RAILOVER_CORRELATION_MIN_NODE": "2",
        "RAILOVER_ZZZZ": "1",
        "RAILOVER_FLAP_MAX": "3",
        "RAILOVER_AGENT_TOKEN": "x",
        "RAILOVER_TEST_PG": "x",
        "RAILOVER_JOB_ID": "j",
        "OTHER": "1",
    }
    warnings = service_variable_warnings(env)
    assert len(warnings) == 3, warnings
    assert "did you mean RAILOVER_CORRELATION_MIN_NODES?" in warnings[0]
    assert "did you mean RAILOVER_FLAP_MAX?" in warnings[1]
    assert "RAILOVER_ZZZZ is not a setting" in warnings[2]
    assert "railover config" in warnings[2]
    agent = agent_unknown({"RAILOVER_AGENT_TOKN": "x", "RAILOVER_AGENT_TOKEN": "x"})
    assert agent == [
        "RAILOVER_AGENT_TOKN is not a setting and is ignored; did you mean RAILOVER_AGENT_TOKEN?"
    ]


def test_every_field_is_known_to_the_warning() -> None:
    env = dict.fromkeys(env_names(Settings), "1")
    assert service_variable_warnings(env) == []


def test_notify_url_without_a_signing_secret_is_refused(tmp_path: Path) -> None:
    """The README's choice: refuse at registration (422 naming notify_url), store nothing."""
    import httpx

    from railover_testing.local import local_service
    from tests.scheduler_svc.helpers import job_body, register_nodes

    body = job_body("j1", ["n0"], notify_url="http://127.0.0.1:9/hook")
    plain = Settings(db_url=f"sqlite:///{tmp_path / 'a.db'}", port=0, allow_anonymous_loopback=True)
    with local_service(plain) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0"])
        r = http.post("/v1/jobs", json=body)
        assert r.status_code == 422, r.text
        assert "notify_url" in r.text and "RAILOVER_NOTIFY_SECRET" in r.text
        assert http.get("/v1/jobs/j1").status_code == 404
        without = {k: v for k, v in body.items() if k != "notify_url"}
        assert http.post("/v1/jobs", json=without).status_code == 201
    signed = Settings(
        db_url=f"sqlite:///{tmp_path / 'b.db'}",
        port=0,
        allow_anonymous_loopback=True,
        webhook_allow_loopback=True,
        notify_secret="s" * 32,
    )
    with local_service(signed) as url, httpx.Client(base_url=url, timeout=30) as http:
        register_nodes(http, ["n0"])
        assert http.post("/v1/jobs", json=body).status_code == 201


def test_kubernetes_service_links_are_neither_settings_nor_misspellings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a pod in the railover namespace gets for the Services railover and railover-agent."""
    links = {
        "RAILOVER_SERVICE_HOST": "10.96.0.10",
        "RAILOVER_SERVICE_PORT": "8080",
        "RAILOVER_SERVICE_PORT_HTTP": "8080",
        "RAILOVER_PORT": "tcp://10.96.0.10:8080",
        "RAILOVER_PORT_8080_TCP": "tcp://10.96.0.10:8080",
        "RAILOVER_PORT_8080_TCP_PROTO": "tcp",
        "RAILOVER_PORT_8080_TCP_PORT": "8080",
        "RAILOVER_PORT_8080_TCP_ADDR": "10.96.0.10",
        "RAILOVER_AGENT_SERVICE_HOST": "10.96.0.11",
        "RAILOVER_AGENT_PORT": "tcp://10.96.0.11:9465",
        "RAILOVER_AGENT_PORT_9465_TCP_ADDR": "10.96.0.11",
    }
    assert service_variable_warnings(links) == []
    assert agent_unknown(links) == []
    for name, value in links.items():
        monkeypatch.setenv(name, value)
    assert Settings().port == 8080
    monkeypatch.setenv("RAILOVER_PORT", "9090")
    assert Settings().port == 9090

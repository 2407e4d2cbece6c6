"""Grafana dashboards: well-formed, and every query names something the programs export."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, ProcessCollector

import agent.metrics  # noqa: F401  # registers the agent's metrics
import scheduler_svc.metrics  # noqa: F401  # registers the service's metrics
from scheduler_svc.main import create_app

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
# Metric names in PromQL: ours all carry the railover_ prefix (label names never do);
# `up` is Prometheus's own scrape health series.
METRIC = re.compile(r"\b(railover_[a-z0-9_]+|up)\b(?!\s*\()")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exported_names() -> set[str]:
    """Every series name the service and the agent can expose, from their registries."""
    # The agent registers a process collector at start, once per process and on its
    # own PROC_ROOT (in-process test agents point it at a scratch directory), so take
    # the names from a collector of our own on the real /proc.
    own = ProcessCollector(namespace="railover_agent", proc="/proc", registry=None)
    names = {"up"}
    for family in [*REGISTRY.collect(), *own.collect()]:
        suffixes = SUFFIXES.get(family.type, ("",))
        names.update(family.name + s for s in suffixes)
    return names


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])  # panels inside collapsed rows


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield p["title"], t
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            yield f"variable {v['name']}", {"expr": v["query"]["query"]}


def test_there_are_the_three_dashboards() -> None:
    uids = {json.loads(d.read_text())["uid"] for d in DASHBOARDS}
    assert uids == {"railover-cluster", "railover-job", "railover-service"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_query_names_exported_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    exported = exported_names()
    seen = 0
    for title, target in queries(dashboard):
        if "expr" not in target:
            continue
        named = METRIC.findall(target["expr"])
        assert named, f"{path.name}: {title!r} queries no Railover metric: {target['expr']}"
        unknown = sorted(set(named) - exported)
        assert not unknown, f"{path.name}: {title!r} names metrics nobody exports: {unknown}"
        seen += 1
    assert seen >= 3


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_panels_are_laid_out_and_identified(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in panels(dashboard):
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        assert p["title"]
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), f"{p['title']}: refIds repeat"


def test_api_queries_name_real_routes() -> None:
    """The decision-history table reads the service's API; its path must exist."""
    routes = set(create_app().openapi()["paths"])
    found = 0
    for path in DASHBOARDS:
        for title, target in queries(json.loads(path.read_text())):
            if "url" in target:
                template = re.sub(r"\$\{job_id\}", "{job_id}", target["url"])
                assert template in routes, f"{path.name}: {title!r} reads {target['url']}"
                found += 1
    assert found == 1


def test_provisioning_points_at_the_dashboards() -> None:
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "railover.yaml").read_text())
    assert prov["providers"][0]["type"] == "file"
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "railover.yaml").read_text())
    uids = {d.get("uid") for d in ds["datasources"]}
    for path in DASHBOARDS:
        for _, target in queries(json.loads(path.read_text())):
            uid = target.get("datasource", {}).get("uid")
            assert uid in uids | {"${datasource}", None}, f"{path.name}: unknown data source {uid}"

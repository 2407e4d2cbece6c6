"""The checked-in OpenAPI document is the app's own; regenerate with `make openapi`."""

from __future__ import annotations

import json
from pathlib import Path

from scheduler_svc.api.openapi_dump import render
from scheduler_svc.main import create_app

DOC = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"


def test_openapi_document_is_current() -> None:
    assert DOC.exists(), "openapi/openapi.json is missing: run `make openapi`"
    assert json.loads(DOC.read_text()) == create_app().openapi(), (
        "openapi/openapi.json is stale: run `make openapi` and commit it"
    )
    assert DOC.read_text() == render()


def test_operation_ids_are_stable_names() -> None:
    spec = create_app().openapi()
    ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "register_node",
        "create_job",
        "post_events",
        "list_decisions",
        "get_paths",
        "evaluate",
        "poll_commands",
        "ack_command",
        "report_checkpoint",
    } <= ids
    for path in spec["paths"].values():
        for op in path.values():
            if op["operationId"] not in {"healthz", "readyz"}:
                assert "401" in op["responses"], op["operationId"]

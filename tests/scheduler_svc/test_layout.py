"""The service's layers, as the imports show them: services/ without cycles, a pure engine."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "scheduler_svc"


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_services_import_each_other_without_a_cycle() -> None:
    modules = {p.stem for p in (ROOT / "services").glob("*.py") if p.stem != "__init__"}
    graph = {
        m: {
            n
            for n in modules
            if f"scheduler_svc.services.{n}" in imports_of(ROOT / "services" / f"{m}.py")
        }
        for m in modules
    }
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        assert m not in path, f"import cycle: {' -> '.join([*path, m])}"
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, [*path, m])
        done.add(m)

    for m in sorted(graph):
        visit(m, [])


def test_engine_reads_no_store_clock_or_http() -> None:
    for path in (ROOT / "engine").glob("*.py"):
        bad = {
            i
            for i in imports_of(path)
            if i.startswith(("scheduler_svc.store", "scheduler_svc.services", "sqlalchemy"))
            or i.startswith(("fastapi", "httpx"))
        }
        assert not bad, f"{path.name} imports {sorted(bad)}"
        assert "datetime.now" not in path.read_text(), f"{path.name} reads the clock"

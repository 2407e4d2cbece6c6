"""The layering ARCHITECTURE.md draws, as the imports show it.

A small AST check over the Python of scheduler_svc, agent, railover_testing and
native_plugin (and, for private names, tests):

- no import circles between modules. Imports inside functions count (they run
  too); imports under ``if TYPE_CHECKING:`` do not. ``from pkg import name``
  is an edge to ``pkg.name`` when that is a module, else to ``pkg``; importing
  ``a.b.c`` is not counted as importing the packages ``a`` and ``a.b``, so a
  package module that gathers its submodules is no circle;
- the layer rules in ``FORBIDDEN`` below: which package may not import which;
- tests import no underscore-private name from another package.

Self-tests at the end feed the checker small synthetic graphs, so it is seen to
fail where it should. The ``KNOWN_*`` constants would list accepted exceptions;
they are empty, and an entry that no longer occurs fails too, so they only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("scheduler_svc", "agent", "railover_testing", "native_plugin")
PRODUCT = ("scheduler_svc", "agent", "native_plugin")
SERVICE_OUTSIDE_ENGINE = tuple(
    f"scheduler_svc.{p}" for p in ("store", "services", "api", "fleet", "twin", "web", "planning")
)

# The HTTP layer but its wire models: routes, dependencies, error handlers, authentication.
HTTP_LAYER = tuple(
    f"scheduler_svc.api.{p.stem}"
    for p in sorted((ROOT / "scheduler_svc" / "api").glob("*.py"))
    if p.stem != "__init__"
)

# (importer, the prefixes it must not import, why). Edit here when a layer changes; a
# prefix covers the package and everything under it.
FORBIDDEN: list[tuple[str, tuple[str, ...], str]] = [
    (
        "scheduler_svc.engine",
        (*SERVICE_OUTSIDE_ENGINE, "sqlalchemy", "fastapi", "httpx"),
        "the engine is pure: no store, no HTTP, nothing above it",
    ),
    (
        "scheduler_svc.store",
        ("scheduler_svc.services", "scheduler_svc.api"),
        "the store serves the services, never the other way round",
    ),
    (
        "scheduler_svc.services",
        HTTP_LAYER,
        "services know no HTTP routes (the wire models, api/schemas/, are the vocabulary both use)",
    ),
    *[
        (p, ("railover_testing", "tests"), "the product never imports the test house")
        for p in PRODUCT
    ],
    ("agent", ("scheduler_svc",), "the agent ships alone; it talks to the service over HTTP"),
]

# Exceptions the checks accept, each to be removed by the change that fixes it (an entry
# that no longer occurs fails too). Empty since issue 34: keep them so.
# Import circles, each as the set of modules in it.
KNOWN_CYCLES: set[frozenset[str]] = set()
# (importer, imported) pairs that break FORBIDDEN.
KNOWN_LAYER_VIOLATIONS: set[tuple[str, str]] = set()
# (test file, module, private name) a test imports across packages.
KNOWN_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def modules_under(root: Path, packages: Iterable[str]) -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            if "migrations" in rel.parts:
                continue  # alembic scripts: loaded by alembic, not imported
            parts = rel.parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found[name] = Module(name, path, is_package)
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_names(module: Module, source: str) -> set[str]:
    """Dotted names the module imports: ``a.b`` for ``import a.b``, ``a.b.c`` for
    ``from a.b import c`` (relative imports resolved; ``import_graph`` trims
    ``a.b.c`` to ``a.b`` where ``c`` is no module)."""
    out: set[str] = set()
    for node in _import_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
            continue
        base = node.module or ""
        if node.level:
            here = module.name.split(".")
            anchor = here if module.is_package else here[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        out.update(base if a.name == "*" else f"{base}.{a.name}" for a in node.names)
    return out


def _nearest_module(name: str, known: Mapping[str, object]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def import_graph(imports: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the checked modules it imports (each name resolved to its nearest module)."""
    graph: dict[str, set[str]] = {}
    for module, names in imports.items():
        targets = {_nearest_module(n, imports) for n in names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan),
    each as the path that closes it, ``a -> b -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_closing_path(graph, c) for c in components]


def _closing_path(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    start = min(component)
    # Breadth-first from start back to start inside the component: the shortest circle.
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start}")  # pragma: no cover


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(
    imports: Mapping[str, set[str]],
    forbidden: Iterable[tuple[str, tuple[str, ...], str]],
) -> set[tuple[str, str]]:
    """(importer, imported) for every import a rule forbids; imported is the name as
    written, trimmed to the nearest checked module where there is one."""
    out: set[tuple[str, str]] = set()
    for module, names in imports.items():
        for importer, banned, _why in forbidden:
            if not _under(module, importer):
                continue
            for name in names:
                if any(_under(name, b) for b in banned):
                    out.add((module, _nearest_module(name, imports) or name))
    return out


def private_imports(
    test_sources: Mapping[str, str], packages: Iterable[str]
) -> set[tuple[str, str, str]]:
    """(test file, module, name) for each ``from <package>... import _name`` in tests,
    and each import of a module whose path has a ``_private`` part."""
    out: set[tuple[str, str, str]] = set()
    packages = tuple(packages)
    for file, source in test_sources.items():
        for node in _import_nodes(ast.parse(source)):
            if isinstance(node, ast.ImportFrom):
                if node.level or not node.module:
                    continue
                if not any(_under(node.module, p) for p in packages):
                    continue
                mod_private = [p for p in node.module.split(".") if _private(p)]
                out.update((file, node.module, p) for p in mod_private)
                out.update((file, node.module, a.name) for a in node.names if _private(a.name))
            else:
                for a in node.names:
                    if any(_under(a.name, p) for p in packages):
                        out.update((file, a.name, p) for p in a.name.split(".") if _private(p))
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _repo_imports() -> dict[str, set[str]]:
    return {
        m.name: imported_names(m, m.path.read_text()) for m in modules_under(ROOT, CHECKED).values()
    }


# --- the repository ----------------------------------------------------------------------
def test_no_import_circles() -> None:
    found = cycles(import_graph(_repo_imports()))
    new = [c for c in found if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import circles:\n" + "\n".join(" -> ".join(c) for c in new)
    gone = KNOWN_CYCLES - {frozenset(c) for c in found}
    assert not gone, f"no longer circles, drop them from KNOWN_CYCLES: {gone}"


def test_layers_import_only_downwards() -> None:
    found = layer_violations(_repo_imports(), FORBIDDEN)
    new = found - KNOWN_LAYER_VIOLATIONS
    why = {
        (m, n): forbidden_why
        for (m, n) in new
        for importer, banned, forbidden_why in FORBIDDEN
        if _under(m, importer) and any(_under(n, b) for b in banned)
    }
    assert not new, "upward imports:\n" + "\n".join(
        f"{m} imports {n}: {why[(m, n)]}" for m, n in sorted(new)
    )
    gone = KNOWN_LAYER_VIOLATIONS - found
    assert not gone, f"no longer violated, drop them from KNOWN_LAYER_VIOLATIONS: {gone}"


def test_the_engine_reads_no_clock() -> None:
    for path in (ROOT / "scheduler_svc" / "engine").glob("*.py"):
        assert "datetime.now" not in path.read_text(), f"{path.name} reads the clock"


def test_tests_import_no_private_name_across_packages() -> None:
    sources = {
        str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "tests").rglob("*.py"))
    }
    found = private_imports(sources, CHECKED)
    new = found - KNOWN_PRIVATE_IMPORTS
    assert not new, "private names imported by tests:\n" + "\n".join(
        f"{f}: from {m} import {n}" for f, m, n in sorted(new)
    )
    gone = KNOWN_PRIVATE_IMPORTS - found
    assert not gone, f"no longer imported, drop them from KNOWN_PRIVATE_IMPORTS: {gone}"


# --- the checker itself, on synthetic code -----------------------------------------------
def _synthetic(sources: Mapping[str, str]) -> dict[str, set[str]]:
    return {
        name: imported_names(Module(name, Path(name), name.count(".") == 0), src)
        for name, src in sources.items()
    }


def test_the_checker_reports_a_circle_through_a_function_level_import() -> None:
    imports = _synthetic(
        {
            "pkg": "",
            "pkg.a": "from pkg.b import thing\n",
            "pkg.b": "def f():\n    from pkg import c\n",
            "pkg.c": "import pkg.a\n",
            "pkg.d": "from pkg.a import x\n",
        }
    )
    assert cycles(import_graph(imports)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_the_checker_skips_type_checking_imports_and_follows_relative_ones() -> None:
    imports = _synthetic(
        {
            "pkg": "",
            "pkg.a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n",
            "pkg.b": "from . import a\nfrom .a import y\n",
        }
    )
    assert import_graph(imports) == {"pkg": set(), "pkg.a": set(), "pkg.b": {"pkg.a"}}
    assert cycles(import_graph(imports)) == []


def test_the_checker_reports_an_upward_import() -> None:
    imports = _synthetic(
        {
            "scheduler_svc.engine.x": "def f():\n    from scheduler_svc.store.jobs import Repo\n",
            "scheduler_svc.store.jobs": "from scheduler_svc.engine.x import f\n",
            "agent.y": "import httpx\n",
        }
    )
    assert layer_violations(imports, FORBIDDEN) == {
        ("scheduler_svc.engine.x", "scheduler_svc.store.jobs")
    }


def test_the_checker_reports_a_private_name_a_test_imports() -> None:
    found = private_imports(
        {
            "tests/t.py": (
                "from agent.runner import Agent, _Stop\n"
                "from scheduler_svc.store._rows import row\n"
                "from tests.helpers import _local\n"
                "from agent import __version__\n"
            )
        },
        CHECKED,
    )
    assert found == {
        ("tests/t.py", "agent.runner", "_Stop"),
        ("tests/t.py", "scheduler_svc.store._rows", "_rows"),
    }

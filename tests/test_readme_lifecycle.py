"""The README's tables of a job's modes and a fault's clearing rules, kept true.

Each row of the job table names the test that shows that transition: it must exist.
The fault table must name every fault kind once, with the clearing rule the engine
applies to it (`engine.fabric.CLEAR_RULE`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from scheduler_svc.engine.fabric import CLEAR_RULE, FaultKind

REPO = Path(__file__).resolve().parents[1]


def table_after(marker: str) -> list[list[str]]:
    """The rows of the Markdown table that follows `<!-- marker -->`, cells stripped."""
    text = (REPO / "README.md").read_text()
    start = text.index(f"<!-- {marker} -->")
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not set("".join(cells)) <= set("-: "):
            rows.append(cells)
    return rows[1:]  # the header row


def test_every_fault_kind_is_listed_once_with_its_clearing_rule() -> None:
    rows = table_after("fault-lifecycle")
    kinds = [r[0].strip("`") for r in rows]
    assert sorted(kinds) == sorted(k.value for k in FaultKind)
    for kind, clears in ((r[0].strip("`"), r[1]) for r in rows):
        rule = clears.split(":", 1)[0].strip()
        assert rule == CLEAR_RULE[FaultKind(kind)].value, (kind, clears)


def test_every_job_transition_names_a_test_that_exists() -> None:
    rows = table_after("job-lifecycle")
    assert len(rows) >= 10
    modes = {"normal", "failed_over", "restarting"}
    for row in rows:
        assert row[0] in modes and set(row[2].split(" or ")) <= modes, row
        path, _, name = row[-1].strip("`").partition("::")
        tree = ast.parse((REPO / path).read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert name in defined, f"README names {row[-1]}, which does not exist"

"""Scripts run the way their own docstrings say, with no PYTHONPATH set.

The benchmarks are a package run from the repository root (`python -m
benchmarks.<name>`), so they import `railover_testing` and `tests`, which the
installed wheel does not ship. One benchmark is run here exactly as its docstring
writes it, at its smallest size; the others are checked to document the same form.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
# `.venv/bin/python -m benchmarks.<name> [options]`: the interpreter is the venv's.
DOCUMENTED = re.compile(r"^\s*(?:Usage: )?\.venv/bin/python -m (benchmarks\.\w+)(.*)$", re.M)


def _documented_command(path: Path) -> tuple[str, str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    m = DOCUMENTED.search(doc)
    assert m is not None, f"{path.name}: its docstring gives no `.venv/bin/python -m` command"
    return m.group(1), m.group(2)


def test_every_benchmark_documents_the_module_form_that_works_without_pythonpath() -> None:
    for path in sorted(BENCHMARKS.glob("*.py")):
        if path.name in {"__init__.py", "benchlib.py"}:
            continue
        module, _ = _documented_command(path)
        assert module == f"benchmarks.{path.stem}", path.name
        assert "PYTHONPATH" not in (ast.get_docstring(ast.parse(path.read_text())) or "")


def test_the_engine_benchmark_runs_as_its_docstring_says_at_its_smallest_size() -> None:
    module, options = _documented_command(BENCHMARKS / "bench_reconcile_engine.py")
    # The docstring's optional arguments, at their smallest: one size, one round.
    assert "--nodes" in options
    assert "--rounds" in options
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-m", module, *shlex.split("--nodes 16 --rounds 1")]
    out = subprocess.run(
        cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "whole-job ms" in out.stdout
    assert re.search(r"^\s+128\s", out.stdout, re.M), out.stdout

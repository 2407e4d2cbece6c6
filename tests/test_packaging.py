"""The wheel ships the service, the agent and the plugin binding, and none of the test support."""

from __future__ import annotations

import ast
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("scheduler_svc", "agent", "native_plugin")


def test_support_package_is_left_out_of_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not any(fnmatch("railover_testing", pattern) for pattern in include)
    for package in PRODUCT:
        assert any(fnmatch(package, pattern) for pattern in include), package


def test_product_code_never_imports_the_support_package() -> None:
    offenders = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                offenders += [
                    f"{path.relative_to(ROOT)}: {name}"
                    for name in names
                    if name.split(".")[0] in {"railover_testing", "tests"}
                ]
    # The demo is built from the support package, so it runs from the checkout (`make demo`).
    assert offenders == []

"""The hostile suite: each attack of issue 30 against a real service or agent on loopback.

Every test under tests/hostile carries the `hostile` marker (`pytest -m hostile` runs
them alone); `make test` collects them with the rest. Attacks here are scaled down to
keep the suite quick; the full sizes and the latency figures are in benchmarks/.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.hostile)

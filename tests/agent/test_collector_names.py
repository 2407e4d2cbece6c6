"""The leaf list of collector names and the registered collectors agree."""

from __future__ import annotations

import subprocess
import sys

from agent.collectors import names
from agent.collectors.catalog import REGISTRY


def test_every_registered_collector_is_named_in_the_leaf_list_and_no_other() -> None:
    assert tuple(REGISTRY) == names.POLLED
    assert all(cls.name == name for name, cls in REGISTRY.items())
    assert names.PLUGIN not in REGISTRY
    assert names.registered_names() == [*REGISTRY, names.PLUGIN]


def test_the_settings_check_names_without_importing_any_collector() -> None:
    # A fresh interpreter: this test process has long imported the collectors.
    probe = (
        "import sys, agent.config\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('agent.collectors.'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['agent.collectors.names']"

"""The names of the agent's collectors: what DISABLED_COLLECTORS may name.

A leaf module, importing nothing of the agent, so the settings can check the
names they are given without importing the collectors themselves (which would
import the settings back). Each collector class takes its ``name`` from here,
and ``agent.collectors.catalog`` imports every one of them; a test checks that
the collectors registered there are exactly ``POLLED``, so a collector added
without its name here (or a name left here without its collector) fails.
"""

from __future__ import annotations

from typing import Final

COUNTERS: Final = "counters"
PCIE: Final = "pcie"
PORTS: Final = "ports"
TOPOLOGY: Final = "topology"
# The plugin listener is not polled, but it is switched off the same way.
PLUGIN: Final = "plugin"

# In the order the collectors register (the order the runner builds them in).
POLLED: Final = (COUNTERS, PCIE, PORTS, TOPOLOGY)


def registered_names() -> list[str]:
    return [*POLLED, PLUGIN]

"""Run the real service on loopback inside this process (demo, tests, benchmarks).

The twin ships with the product and runs the service the same way, so the parts live in
scheduler_svc.twin.inprocess; this module keeps the name the tests import.
"""

from scheduler_svc.twin.inprocess import (
    ManualClock,
    free_port,
    local_app,
    local_service,
    served_app,
)

__all__ = ["ManualClock", "free_port", "local_app", "local_service", "served_app"]

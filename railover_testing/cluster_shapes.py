"""Node topologies of common GPU servers, as an agent would register them.

They live in scheduler_svc.twin.hardware (the fleet twin registers them too); this
module keeps the name the tests and the demo import.
"""

from scheduler_svc.twin.hardware import dual_port_node, hgx_node

__all__ = ["dual_port_node", "hgx_node"]

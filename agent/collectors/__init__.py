"""The agent's collectors, registered by name (see ``base``).

``names`` is the leaf list of their names (what the settings check
DISABLED_COLLECTORS against), ``catalog`` imports every collector so it
registers, ``supervise`` runs each in its own thread. This package module
imports none of them, so importing ``agent.collectors.names`` imports no
collector.
"""

"""The agent's Prometheus metrics, module-level so every part shares them.

All names carry the ``railover_agent_`` prefix and base units. /healthz is not
counted anywhere.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, ProcessCollector

# collector: a registered collector name (topology, ports, counters, pcie, plugin).
COLLECTOR_SUCCESS = Gauge(
    "railover_agent_collector_success",
    "1 if the collector's last run succeeded, 0 if it failed.",
    ["collector"],
)
COLLECTOR_DURATION = Gauge(
    "railover_agent_collector_duration_seconds",
    "How long the collector's last run took.",
    ["collector"],
)

SPOOL_EVENTS = Gauge("railover_agent_spool_events", "Events waiting in the on-disk spool.")
# kind: event kind (port_down, counter, progress, ...).
EVENTS_SPOOLED = Counter(
    "railover_agent_events_spooled_total", "Events written to the spool.", ["kind"]
)
EVENTS_SENT = Counter(
    "railover_agent_events_sent_total", "Events the service accepted (new or duplicate)."
)
EVENTS_DUPLICATE = Counter(
    "railover_agent_events_duplicate_total",
    "Events the service already had (a resend after a lost reply).",
)
# kind: event kind; reason: spool_full (bound reached) or rejected (the service
# refused the event itself with a 4xx; it is kept in the dead-letter table).
EVENTS_DROPPED = Counter(
    "railover_agent_events_dropped_total",
    "Events that will never reach the service.",
    ["kind", "reason"],
)

# kind: event kind folded into a waiting row of its component (a full spool).
EVENTS_COALESCED = Counter(
    "railover_agent_events_coalesced_total",
    "Events a full spool folded into the row waiting for the same component.",
    ["kind"],
)
SPOOL_QUARANTINED = Counter(
    "railover_agent_spool_quarantined_total",
    "Spool rows that were not events, moved to the quarantine table.",
)
SPOOL_RESETS = Counter(
    "railover_agent_spool_resets_total",
    "Spool files SQLite could not use, moved aside for an empty one.",
)

# endpoint: register, events, commands, ack; outcome: ok, http_<status>, error.
SERVICE_REQUESTS = Counter(
    "railover_agent_service_requests_total",
    "Calls to the central service, by outcome.",
    ["endpoint", "outcome"],
)
SERVICE_REQUEST_DURATION = Histogram(
    "railover_agent_service_request_duration_seconds",
    "Duration of single calls to the central service.",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
SERVICE_UP = Gauge("railover_agent_service_up", "1 if the last call to the service got an answer.")
REGISTRATIONS = Counter(
    "railover_agent_registrations_total", "Topology registrations the service accepted."
)

# device/port: RNIC name and port number as in /sys/class/infiniband.
PORT_ACTIVE = Gauge(
    "railover_agent_port_active", "1 if the RNIC port state is ACTIVE.", ["device", "port"]
)

# device/port: as above; counter: a watched counter (RAILOVER_AGENT_COUNTER_EVENTS).
COUNTER_AVAILABLE = Gauge(
    "railover_agent_port_statistic_available",
    "1 if the watched counter can count on the port, 0 if it cannot (N/A (no PMA), "
    "unreadable, not exposed): a rise there can never be reported.",
    ["device", "port", "counter"],
)

PLUGIN_CLIENTS = Gauge("railover_agent_plugin_clients", "Connected native plugin clients.")
# label "type": wire message type name (CqeError, PortEvent, Hello, ...).
PLUGIN_FRAMES = Counter(
    "railover_agent_plugin_frames_total", "Frames received from plugin clients.", ["type"]
)
PLUGIN_MALFORMED = Counter(
    "railover_agent_plugin_malformed_frames_total",
    "Malformed or oversized frames; each one drops its connection.",
)
# reason: hello (no HELLO in time), partial_frame (a frame not completed in time),
# process_slots (the process has its connections already), slots (the agent has).
PLUGIN_REFUSED = Counter(
    "railover_agent_plugin_connections_refused_total",
    "Plugin connections refused or closed by a limit.",
    ["reason"],
)
# reason: client_limit / node_limit (too many communicators tracked).
PLUGIN_PROGRESS_DROPPED = Counter(
    "railover_agent_plugin_progress_dropped_total",
    "Progress frames for a communicator beyond the hub's limits, not tracked.",
    ["reason"],
)
# reason: unknown_command (not one the hub handed out), not_addressed (handed to other
# ranks or jobs), duplicate (said already), queue_full.
PLUGIN_ACKS_REFUSED = Counter(
    "railover_agent_plugin_acks_refused_total",
    "Acks from plugin clients not passed on to the service.",
    ["reason"],
)
PLUGIN_FRAMES_SENT = Counter(
    "railover_agent_plugin_frames_sent_total", "Frames sent to plugin clients.", ["type"]
)

COMMANDS_RECEIVED = Counter(
    "railover_agent_commands_received_total", "Commands fetched from the service."
)
COMMANDS_FORWARDED = Counter(
    "railover_agent_commands_forwarded_total", "Commands handed to at least one plugin client."
)
# status: delivered, applied, failed.
ACKS_SENT = Counter(
    "railover_agent_acks_sent_total",
    "Rank acknowledgements sent to the service (several may share one request).",
    ["status"],
)


_process_collector: ProcessCollector | None = None


def watch_own_process(proc_root: Path) -> None:
    """Export the agent's own CPU and memory from PROC_ROOT (its cost is a budget)."""
    global _process_collector  # noqa: PLW0603  # one collector per process, made on first start
    if _process_collector is None:
        _process_collector = ProcessCollector(
            namespace="railover_agent", proc=str(proc_root), registry=REGISTRY
        )

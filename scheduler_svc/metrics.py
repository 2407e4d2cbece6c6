"""Service metrics. Module-level objects; labels are bounded sets named beside each metric."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# action: failover | restart | restart_scaled | none
DECISIONS = Counter("railover_decisions_total", "Decisions made, by action", ["action"])

# result: accepted | duplicate ; kind: the EventKind values (a closed set)
EVENTS = Counter(
    "railover_events_received_total", "Events received from agents", ["kind", "result"]
)

FAULTS_OPENED = Counter("railover_faults_opened_total", "Faults opened, by kind", ["kind"])

DECISION_LATENCY = Histogram(
    "railover_decision_latency_seconds",
    "Time from receiving an event batch to its decisions being stored",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)

# route: the route template (e.g. /v1/jobs/{job_id}), never the raw path
REQUEST_LATENCY = Histogram(
    "railover_http_request_duration_seconds",
    "API request latency",
    ["method", "route", "status"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0),
)

# kind: failover | rebalance | failback | abort
COMMANDS_ISSUED = Counter("railover_commands_issued_total", "Commands issued to nodes", ["kind"])

# status: delivered | applied | failed
COMMAND_ACKS = Counter("railover_command_acks_total", "Command acknowledgements", ["status"])

OPEN_FAULTS = Gauge("railover_open_faults", "Faults currently open (refreshed on scrape)")
JOBS = Gauge("railover_jobs", "Registered jobs by mode (refreshed on scrape)", ["mode"])

"""Service metrics. Module-level objects; labels are bounded sets named beside each metric."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# action: failover | restart | restart_scaled | none
DECISIONS = Counter("railover_decisions_total", "Decisions made, by action", ["action"])

# result: accepted | duplicate ; kind: the EventKind values (a closed set)
EVENTS = Counter(
    "railover_events_received_total", "Events received from agents", ["kind", "result"]
)

# reason: unknown_device | unknown_port | no_device | rank_elsewhere | future_time
EVENTS_REFUSED = Counter(
    "railover_events_refused_total", "Event batches refused at ingestion, by reason", ["reason"]
)

FAULTS_OPENED = Counter("railover_faults_opened_total", "Faults opened, by kind", ["kind"])
# An UNREACHABLE fault closed because the node's agent reached the service again
# (services/reach.py); how: poll | stream | ack
NODES_REACHABLE_AGAIN = Counter(
    "railover_nodes_reachable_again_total",
    "Unreachable nodes whose agent was heard from again, by how",
    ["how"],
)
# kind: nvl_transit | failback (services/refusals.py: fallen back from, never a restart)
MITIGATIONS_REFUSED = Counter(
    "railover_mitigations_refused_total",
    "Optional mitigations the ranks refused, by command kind",
    ["kind"],
)

# A storm's reports share their jobs' reconcile passes (services/passes.py): the ratio
# of these two is how many reports one pass answered for.
REPORT_PASSES = Counter(
    "railover_report_reconcile_passes_total", "Reconcile passes of a job run for agents' reports"
)
REPORTS_RECONCILED = Counter(
    "railover_report_reconcile_requests_total",
    "Jobs an agent's report asked to have reconciled (each covered by one shared pass)",
)
# Small writes of concurrent requests share transactions (store/groupcommit.py): how many
# works each one carried. A quiet service commits batches of one.
GROUP_COMMIT_WORKS = Histogram(
    "railover_group_commit_works",
    "Requests' writes that shared one transaction (agents' reports, audit entries)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)

# action: the decisions' actions (engine/decision.py Action); a batch deciding two
# actions is observed once under each.
DECISION_LATENCY = Histogram(
    "railover_decision_latency_seconds",
    "Time from receiving an event batch to its decisions being stored, by action",
    ["action"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)

# route: the route template (e.g. /v1/jobs/{job_id}), never the raw path
REQUEST_LATENCY = Histogram(
    "railover_http_request_duration_seconds",
    "API request latency",
    ["method", "route", "status"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0),
)

# kind: failover | rebalance | failback | abort | checkpoint_now
COMMANDS_ISSUED = Counter("railover_commands_issued_total", "Commands issued to nodes", ["kind"])

# status: delivered | applied | failed
COMMAND_ACKS = Counter("railover_command_acks_total", "Command acknowledgements", ["status"])

OPEN_FAULTS = Gauge("railover_open_faults", "Faults currently open (refreshed on scrape)")
JOBS = Gauge("railover_jobs", "Registered jobs by mode (refreshed on scrape)", ["mode"])

# --- read from the store at scrape time (api/health.py calls services.gauges) -----------
# Every replica reports the same values, so dashboards use max(), never sum().

# The fabric's ports (GPU-fabric RNIC ports of registered nodes) by rail and health:
# ok (ACTIVE, no open fault) | down (not ACTIVE) | fault (an open fault on it). Bounded by
# rails x 3, whatever the fleet's size.
RNIC_PORTS = Gauge(
    "railover_rnic_ports",
    "GPU-fabric RNIC ports by rail and health, as the service sees them",
    ["rail", "health"],
)
# One series per port that is not ok (health: down | fault), value 1; a port that is ok
# again loses its series. Bounded by what is broken, never by the fleet (65k ports at
# 8,192 nodes would be one series each).
RNIC_UNHEALTHY = Gauge(
    "railover_rnic_unhealthy",
    "1 for each GPU-fabric RNIC port that is not ACTIVE or has an open fault",
    ["node", "device", "port", "rail", "health"],
)
# node: nodes with at least one fabric port not ok (the others have no series).
NODE_UNHEALTHY_PORTS = Gauge(
    "railover_node_unhealthy_rnic_ports",
    "GPU-fabric RNIC ports of the node that are not ACTIVE or have an open fault",
    ["node"],
)
# state: issued | delivered (commands no rank has acknowledged as applied or failed yet)
COMMANDS_UNACKNOWLEDGED = Gauge(
    "railover_commands_unacknowledged", "Commands waiting for acknowledgement", ["state"]
)
COMMAND_OLDEST_UNACKNOWLEDGED = Gauge(
    "railover_command_oldest_unacknowledged_age_seconds",
    "Age of the oldest command still waiting for acknowledgement (0 when none)",
)
# job_id: registered jobs only (a deleted job's series are removed), so bounded by live jobs.
JOB_FAILED_OVER = Gauge(
    "railover_job_failed_over_seconds",
    "How long the job has run failed over (0 when it is not failed over)",
    ["job_id"],
)
# estimate: measured (reported by the job) | predicted (model or paper-default k of its
# newest decision)
JOB_SLOWDOWN_K = Gauge(
    "railover_job_slowdown_ratio",
    "Slowdown factor k while failed over (step time failed over / normal step time)",
    ["job_id", "estimate"],
)
# The stored decisions' saved_gpu_s summed (engine.decision.saved_gpu_s: the README's
# "GPU-hours saved"); the status page and the demo show the same number.
GPU_SECONDS_SAVED = Gauge(
    "railover_decisions_saved_gpu_seconds",
    "GPU time the stored decisions' failovers saved against the cheapest restart",
)

# Incremented by the correlation code (issue 5: several nodes losing RNICs cabled to one
# switch within a short window). Defined here first because the alert rules and the
# dashboards need the name now; the correlation code imports this object, not a second one.
# switch: fabric switch name from the rail map (bounded by the fabric's switches).
SWITCH_FAULTS = Counter(
    "railover_switch_faults_total", "Switch failures inferred from correlated faults", ["switch"]
)

# --- fleet notification (scheduler_svc.fleet) --------------------------------------------
# target: webhook | k8s | slurm ; result: delivered | retry | dead
DELIVERIES = Counter(
    "railover_deliveries_total",
    "Outbox delivery attempts by target kind and outcome",
    ["target", "result"],
)
# target: webhook | k8s | slurm
DELIVERY_LATENCY = Histogram(
    "railover_delivery_latency_seconds",
    "Time from an event being stored to its successful delivery, retries included",
    ["target"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0),
)

# --- cluster-wide coordination ---
MAINTENANCE_FLAGS = Counter(
    "railover_maintenance_flags_total", "Ports flagged for maintenance after repeated flaps"
)
# outcome: ok | error. A rate of zero means the loop that times fail-backs, deadlines and
# retries has stopped on this replica.
SWEEPS = Counter(
    "railover_coordinator_sweeps_total", "Coordinator sweeps run, by outcome", ["outcome"]
)
RETRIGGERS = Counter(
    "railover_switch_point_retriggers_total",
    "Switch points re-issued under a new epoch because a rank was already past them",
)
COMMAND_RETRIES = Counter(
    "railover_command_retries_total", "Commands re-issued after their acknowledgement deadline"
)
# kind: failover | rebalance | failback | abort | checkpoint_now
COMMANDS_FAILED = Counter(
    "railover_commands_failed_total", "Commands given up after the last attempt", ["kind"]
)
# Stock NCCL (issue 16). result: registered (new communicator), known, unplaced
# (no single job on the node to attach it to).
CCL_ANNOUNCEMENTS = Counter(
    "railover_ccl_announcements_total",
    "Communicators announced by the NCCL profiler plugin",
    ["result"],
)
CCL_STALLS = Counter("railover_ccl_stalls_total", "Collective stalls recorded on nodes")

MIRROR_FAILURES = Counter(
    "railover_mirror_failures_total",
    "Iterations a checkpoint node reported it could not rebuild (replays not counted)",
)
CHECKPOINT_REQUESTS = Counter(
    "railover_checkpoint_requests_total",
    "Normal checkpoints asked of jobs after a mirror failure (checkpoint_now)",
)

# Open server-sent-event streams of commands (GET /v1/nodes/{node}/commands/stream).
COMMAND_STREAMS = Gauge("railover_command_streams", "Command streams open on this replica")
# reason: max_age | stopping | unavailable | client_gone
COMMAND_STREAM_ENDS = Counter(
    "railover_command_stream_ends_total", "Command streams ended, by reason", ["reason"]
)

# reason: connections | connections_per_peer | header_timeout | body_timeout |
# headers_too_large | invalid | concurrency (scheduler_svc/serving.py: refused before the
# app sees them)
HTTP_REFUSED = Counter(
    "railover_http_refused_total",
    "Connections and requests the HTTP server refused before the app, by reason",
    ["reason"],
)

# table: events | audit_log | deliveries | dead_letters (services/retention.py)
PRUNED = Counter("railover_pruned_rows_total", "Rows deleted by retention, by table", ["table"])

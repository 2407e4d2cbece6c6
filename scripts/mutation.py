"""Mutation testing, module by module: how many small bugs do the tests catch?

For each target below, mutmut (one worker unless --workers says more, niced: the
machine is shared) puts one small change at a time into a copy of the tracked tree
under build/mutation/<target>/ and runs the tests that reach the changed function
(mutmut records which tests call which function in a first, clean run). A
mutant the tests do not notice "survives". Survivors that cannot change
behaviour are listed with a reason in scripts/mutation_equivalent.txt; every
other survivor is a test to write.

    python scripts/mutation.py                 # every target, in order
    python scripts/mutation.py signing notify  # some of them
    python scripts/mutation.py engine --workers 2  # two mutants at a time
    python scripts/mutation.py engine --only 'scheduler_svc.engine.outcomes.x_failback__mutmut_*'
                                               # one function's mutants alone, results files kept

Prints killed/survived per target and writes the table under "Test strength"
in benchmarks/RESULTS.md (results of targets not run this time are kept, from
benchmarks/mutation-results.json).
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mutmut.stats import status_by_exit_code

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutation"
EQUIVALENT = ROOT / "scripts" / "mutation_equivalent.txt"
RESULTS_JSON = ROOT / "benchmarks" / "mutation-results.json"
# Runs of different targets may go on at once, each in a build folder of its own; the
# files they all write (results, the table, equivalents) are read and written under it.
SHARED_LOCK = ROOT / "build" / "mutation" / ".shared-files.lock"
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Test strength"

# The copy imports these packages; only files matching a target's globs are mutated.
SOURCE_PATHS = ("scheduler_svc", "agent", "native_plugin", "railover_testing")


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    files: tuple[str, ...]  # globs of the files to mutate
    tests: tuple[str, ...]  # the tests that cover them
    # Mutant names to keep (fnmatch), to mutate some functions of a larger file.
    only: tuple[str, ...] = ()


TARGETS = (
    Target(
        # Issue 33: the collector paused for whole-job work and for a large request body.
        "large-body",
        ("scheduler_svc/main.py", "scheduler_svc/services/gcpause.py"),
        ("tests/scheduler_svc/test_gcpause.py",),
        only=(
            "scheduler_svc.main.xǁPauseCollectorForLargeBodiesǁ*",
            "scheduler_svc.services.gcpause.*",
        ),
    ),
    Target(
        # Degraded RNICs (issue 31): weights by the bandwidth left, and failover where cheaper.
        "degradation",
        ("scheduler_svc/engine/degradation.py",),
        ("tests/engine/test_degraded_decisions.py",),
    ),
    Target(
        # Issue 29: the twin's books (progress and losses by cause, shrunk and failed over)
        # and its fleet manager's placements (requeue, shrink, grow back).
        "twin-fleet",
        ("scheduler_svc/twin/books.py", "scheduler_svc/twin/fleet.py"),
        ("tests/twin/test_twin.py",),
        only=(
            "scheduler_svc.twin.books.xǁTwinJobǁaccrue__mutmut_*",
            "scheduler_svc.twin.books.xǁTwinJobǁ__post_init____mutmut_*",
            "scheduler_svc.twin.fleet.xǁFleetManagerǁrequeue__mutmut_*",
            "scheduler_svc.twin.fleet.xǁFleetManagerǁgrow__mutmut_*",
            "scheduler_svc.twin.fleet.xǁFleetManagerǁplace__mutmut_*",
        ),
    ),
    Target(
        # Spares kept back for faults only a replacement fixes (RAILOVER_SPARE_RESERVE).
        "spares",
        (
            "scheduler_svc/engine/decision.py",
            "scheduler_svc/engine/outcomes.py",
            "scheduler_svc/engine/coordination.py",
        ),
        (
            "tests/engine/test_decision.py",
            "tests/engine/test_checkpoint_decisions.py",
            "tests/engine/test_cost_decisions.py",
            "tests/engine/test_coordination.py",
            "tests/engine/test_coordination_strength.py",
            "tests/engine/test_policies.py",
        ),
        only=(
            "scheduler_svc.engine.decision.x_spare_usable__mutmut_*",
            "scheduler_svc.engine.decision.x_spare_price_s__mutmut_*",
            "scheduler_svc.engine.decision.x_at_least__mutmut_*",
            "scheduler_svc.engine.outcomes.x__beyond_reserve__mutmut_*",
            "scheduler_svc.engine.outcomes.x__spare_price_s__mutmut_*",
            "scheduler_svc.engine.outcomes.x__repair_s__mutmut_*",
            "scheduler_svc.engine.outcomes.x__restart_at__mutmut_*",
            "scheduler_svc.engine.coordination.x_restart_at_checkpoint__mutmut_*",
        ),
    ),
    Target(
        # A write's audit entry in the commit of its change, and the status it records.
        "audit",
        ("scheduler_svc/fleet/audit.py", "scheduler_svc/api/routing.py"),
        (
            "tests/scheduler_svc/test_middleware.py",
            "tests/fleet/test_api.py",
            "tests/scheduler_svc/test_fault_lifecycle_api.py",
        ),
        # The router and its route class run when the API modules are imported, before
        # any test: mutmut maps no test to them, so their mutants are left out.
        only=(
            "scheduler_svc.fleet.audit.x_expect__mutmut_*",
            "scheduler_svc.fleet.audit.x_done__mutmut_*",
            "scheduler_svc.fleet.audit.x_add_to__mutmut_*",
            "scheduler_svc.fleet.audit.x_entry__mutmut_*",
            "scheduler_svc.api.routing.x__commit_where_it_ran__mutmut_*",
            "scheduler_svc.api.routing.x_answering_status__mutmut_*",
        ),
    ),
    Target(
        # Issue 33: a pass reads the commands it needs (not the job's history) and each
        # row once (the next epoch from the communicator row it already read).
        "pass-reads",
        (
            "scheduler_svc/services/commands.py",
            "scheduler_svc/store/commands.py",
            "scheduler_svc/store/uow.py",
        ),
        (
            "tests/scheduler_svc/test_pass_reads.py",
            "tests/scheduler_svc/test_command_history.py",
            "tests/store/test_command_queries.py",
        ),
        only=(
            "scheduler_svc.services.commands.x_next_epoch__mutmut_*",
            "scheduler_svc.store.uow.x_hold__mutmut_*",
            "scheduler_svc.store.uow.x_release__mutmut_*",
            "scheduler_svc.store.commands.xǁCommandRepoǁmax_epoch__mutmut_*",
            "scheduler_svc.store.commands.xǁCommandRepoǁswitch_points__mutmut_*",
            "scheduler_svc.store.commands.xǁCommandRepoǁjob_commands__mutmut_*",
            "scheduler_svc.store.commands.xǁCommandRepoǁcomm_commands__mutmut_*",
            "scheduler_svc.store.commands.xǁCommandRepoǁincarnation_commands__mutmut_*",
            "scheduler_svc.store.commands.xǁCommandRepoǁ_matching__mutmut_*",
            "scheduler_svc.services.commands.x_left_their_primary__mutmut_*",
            "scheduler_svc.store.commands.x__in_order__mutmut_*",
        ),
    ),
    Target(
        # twin --history: the history's own jobs, newest first, as many as fit.
        "twin-history",
        ("scheduler_svc/twin/cluster.py", "scheduler_svc/twin/fitted.py"),
        ("tests/twin/test_twin_history.py",),
        only=(
            "scheduler_svc.twin.cluster.x__from_history__mutmut_*",
            "scheduler_svc.twin.fitted.x_shapes_of__mutmut_*",
        ),
    ),
    Target(
        "signing",
        ("scheduler_svc/fleet/signing.py",),
        ("tests/scheduler_svc/test_signing.py",),
    ),
    Target(
        "deps",
        ("scheduler_svc/api/deps.py", "scheduler_svc/api/token_cache.py"),
        ("tests/scheduler_svc/test_deps.py", "tests/scheduler_svc/test_after_answer.py"),
        only=(
            "scheduler_svc.api.deps.*",
            "scheduler_svc.api.token_cache.xǁTokenCacheǁholds*",
        ),
    ),
    Target(
        # Issue 30: where webhooks may go (the address policy, checked before and after
        # resolution), credentials never shown, and the whole-attempt deadline.
        "outbound",
        ("scheduler_svc/fleet/outbound.py",),
        ("tests/fleet/test_outbound.py",),
    ),
    Target(
        # Issue 30: the HTTP server's guard (deadlines, header cap, connection caps, the
        # rate-limited refusal line), against real uvicorn under both parsers. Slow: each
        # mutant starts the services of tests/hostile/test_service_limits.py.
        "guard",
        ("scheduler_svc/serving.py",),
        ("tests/hostile/test_service_limits.py",),
    ),
    Target(
        "notify",
        ("scheduler_svc/services/delivery.py",),
        # The listener (PostgreSQL LISTEN) and the skipped looks are test_listen.py's, the
        # SQLite watermark test_watermark.py's, the close at a stop test_stop_ends_polls.py's.
        (
            "tests/scheduler_svc/test_delivery.py",
            "tests/scheduler_svc/test_listen.py",
            "tests/scheduler_svc/test_listener_strength.py",
            "tests/scheduler_svc/test_watermark.py",
            "tests/scheduler_svc/test_stop_ends_polls.py",
        ),
    ),
    Target(
        # The SQLite watermark and the close at a stop, by the tests written for them (the
        # notify target's whole list takes minutes a mutant: it starts many services).
        "watermark",
        ("scheduler_svc/services/delivery.py",),
        ("tests/scheduler_svc/test_watermark.py", "tests/scheduler_svc/test_stop_ends_polls.py"),
        only=(
            "scheduler_svc.services.delivery.xǁCommandWatermarkǁ*",
            "scheduler_svc.services.delivery.xǁCommandNotifierǁclos*",
        ),
    ),
    Target(
        "spool",
        ("agent/spool.py", "agent/events.py"),
        (
            "tests/agent/test_agent_spool.py",
            "tests/agent/test_spool_strength.py",
            "tests/hostile/test_agent_spool_corruption.py",
        ),
    ),
    Target(
        # The plugin hub's bounds of issue 30 (acks, progress, connections, names), by the
        # hostile socket tests and the commands' own.
        "hub",
        ("agent/plugin.py", "agent/logsafe.py"),
        (
            "tests/hostile/test_agent_plugin_socket.py",
            "tests/agent/test_agent_plugin_commands.py",
        ),
        only=(
            "agent.plugin.xǁPluginHubǁon_ack__mutmut_*",
            "agent.plugin.xǁPluginHubǁ_pass_ack__mutmut_*",
            "agent.plugin.xǁPluginHubǁ_release_held__mutmut_*",
            "agent.plugin.xǁPluginHubǁ_expire_held__mutmut_*",
            "agent.plugin.xǁPluginHubǁ_progress__mutmut_*",
            "agent.plugin.xǁPluginHubǁforget__mutmut_*",
            "agent.plugin.xǁPluginServerǁ_serve__mutmut_*",
            "agent.plugin.x__device_name__mutmut_*",
            "agent.logsafe.x_printable__mutmut_*",
        ),
    ),
    Target(
        "store-idempotency",
        ("scheduler_svc/store/idempotency.py", "scheduler_svc/store/faults.py"),
        ("tests/store/test_idempotency.py",),
        only=(
            "scheduler_svc.store.idempotency.x_insert_unless_taken__mutmut_*",
            "scheduler_svc.store.faults.xǁEventRepoǁinsert_new__mutmut_*",
        ),
    ),
    Target(
        # Issue 33: a report's writes in fewer statements: inserts on a taken key in one
        # statement (not a savepoint), the due marks with the job ids, a port's level with
        # its switch, a lone work without a savepoint. The statements are built at import.
        "report-writes",
        (
            "scheduler_svc/store/idempotency.py",
            "scheduler_svc/store/faults.py",
            "scheduler_svc/store/jobs.py",
            "scheduler_svc/store/nodes.py",
            "scheduler_svc/store/groupcommit.py",
        ),
        (
            "tests/store/test_idempotency.py",
            "tests/store/test_due_marks.py",
            "tests/store/test_repositories.py",
            "tests/store/test_groupcommit.py",
        ),
        only=(
            "scheduler_svc.store.idempotency.x_insert_new__mutmut_*",
            "scheduler_svc.store.idempotency.x_insert_values__mutmut_*",
            "scheduler_svc.store.idempotency.x__default__mutmut_*",
            "scheduler_svc.store.faults.xǁEventRepoǁinsert_new__mutmut_*",
            "scheduler_svc.store.faults.xǁFaultRepoǁopen_if_new__mutmut_*",
            "scheduler_svc.store.faults.xǁFaultRepoǁopen_switch_fault__mutmut_*",
            "scheduler_svc.store.jobs.xǁJobRepoǁmark_due_on_nodes__mutmut_*",
            "scheduler_svc.store.jobs.xǁDecisionRepoǁadd__mutmut_*",
            "scheduler_svc.store.nodes.xǁNodeRepoǁobserve_port__mutmut_*",
            "scheduler_svc.store.groupcommit.xǁGroupCommitǁ_execute__mutmut_*",
        ),
    ),
    Target(
        # Issue 33: the evidence held in memory per engine: which writes a commit's hooks
        # count and on which nodes, the stamp, what a read takes from the view and what
        # from the store, and the engine's values built once per fault held.
        "evidence-view",
        ("scheduler_svc/store/evidence_view.py", "scheduler_svc/services/fabric.py"),
        ("tests/store/test_evidence_view.py",),
        only=(
            "scheduler_svc.store.evidence_view.*",
            "scheduler_svc.services.fabric.x_evidence__mutmut_*",
            "scheduler_svc.services.fabric.xǁ_StoreReadsǁ*",
        ),
    ),
    Target(
        # Issue 33: reads of values on the session's connection, and the evidence's
        # quarantines, switch failures and windows read through it.
        "plain-reads",
        (
            "scheduler_svc/store/plain.py",
            "scheduler_svc/store/maintenance.py",
            "scheduler_svc/store/faults.py",
            "scheduler_svc/services/fabric.py",
        ),
        ("tests/store/test_plain.py", "tests/store/test_repositories.py"),
        only=(
            "scheduler_svc.store.plain.x_execute__mutmut_*",
            "scheduler_svc.store.maintenance.xǁMaintenanceRepoǁin_force__mutmut_*",
            "scheduler_svc.store.maintenance.xǁMaintenanceRepoǁopen_flag_values__mutmut_*",
            "scheduler_svc.store.faults.xǁFaultRepoǁopen_switch_fault_values__mutmut_*",
            "scheduler_svc.services.fabric.x_evidence__mutmut_*",
            "scheduler_svc.services.fabric.x__read__mutmut_*",
        ),
    ),
    Target(
        # Issue 33: open faults read with their own ports' levels (one statement). The
        # statements themselves are built at import (`_unresolved`), before any mutant is
        # switched on: what a run can mutate is which of them is asked, with what.
        "evidence-read",
        ("scheduler_svc/store/faults.py", "scheduler_svc/services/fabric.py"),
        ("tests/store/test_repositories.py",),
        only=(
            "scheduler_svc.store.faults.xǁFaultRepoǁunresolved_at_their_ports__mutmut_*",
            "scheduler_svc.store.faults.x__pick__mutmut_*",
            "scheduler_svc.services.fabric.x__faults_at_their_ports__mutmut_*",
        ),
    ),
    Target(
        # What replaces an overtaken fail-back, reading no rank when there is none.
        "overrides",
        ("scheduler_svc/services/reconciler.py",),
        ("tests/scheduler_svc/test_overrides.py",),
        only=("scheduler_svc.services.reconciler.x_replacing_overtaken__mutmut_*",),
    ),
    Target(
        # A job index's eager part, its lookups made on first read, and the work a request
        # leaves for after its answer (making them, letting go of a replaced index).
        "index-lookups",
        (
            "scheduler_svc/engine/jobindex.py",
            "scheduler_svc/engine/routes.py",
            "scheduler_svc/store/uow.py",
            "scheduler_svc/api/deps.py",
            "scheduler_svc/services/reconciler.py",
        ),
        (
            "tests/engine/test_jobindex_build.py",
            "tests/engine/test_jobindex_equivalence.py",
            "tests/scheduler_svc/test_after_answer.py",
            "tests/scheduler_svc/test_deps.py",
        ),
        only=(
            "scheduler_svc.engine.jobindex.x_build__mutmut_*",
            "scheduler_svc.engine.jobindex.x__grouped__mutmut_*",
            "scheduler_svc.engine.jobindex.x__once_each__mutmut_*",
            "scheduler_svc.engine.jobindex.x__class_counts__mutmut_*",
            "scheduler_svc.engine.jobindex.x__lookups__mutmut_*",
            "scheduler_svc.engine.jobindex.x__endpoint__mutmut_*",
            "scheduler_svc.engine.jobindex.x__comm_index__mutmut_*",
            "scheduler_svc.engine.jobindex.x_connectivity__mutmut_*",
            "scheduler_svc.engine.routes.xǁOnceǁ*",
            "scheduler_svc.engine.routes.xǁJobIndexǁwarm__mutmut_*",
            "scheduler_svc.engine.routes.x_class_pairs__mutmut_*",
            "scheduler_svc.engine.routes.x_pair_counts__mutmut_*",
            "scheduler_svc.engine.routes.x__pairs__mutmut_*",
            "scheduler_svc.store.uow.x_answering__mutmut_*",
            "scheduler_svc.store.uow.x_after_answer__mutmut_*",
            "scheduler_svc.api.deps.x_get_session__mutmut_*",
            "scheduler_svc.api.deps.x__after_answer__mutmut_*",
            "scheduler_svc.api.deps.x__run_each__mutmut_*",
            "scheduler_svc.services.reconciler.xǁJobIndexCacheǁ_put__mutmut_*",
            "scheduler_svc.services.reconciler.x_lookups_after_answer__mutmut_*",
        ),
    ),
    Target(
        # Issue 33: a node's routes kept on the job index while what fails there is the same.
        "node-routes",
        ("scheduler_svc/engine/jobindex.py",),
        ("tests/engine/test_jobindex_equivalence.py", "tests/engine/test_jobindex_build.py"),
        only=(
            "scheduler_svc.engine.jobindex.x__changed__mutmut_*",
            "scheduler_svc.engine.jobindex.x__failures_by_node__mutmut_*",
            "scheduler_svc.engine.jobindex.x__switches__mutmut_*",
        ),
    ),
    Target(
        # Issue 33: open faults read as plain values; a decision's fault named from them.
        "evidence-values",
        (
            "scheduler_svc/store/faults.py",
            "scheduler_svc/services/fabric.py",
            "scheduler_svc/fleet/events.py",
        ),
        (
            "tests/store/test_repositories.py",
            "tests/scheduler_svc/test_pass_reads.py",
            "tests/scheduler_svc/test_plan_cache.py",
            "tests/scheduler_svc/test_fault_lifecycle_api.py",
        ),
        only=(
            "scheduler_svc.store.faults.xǁFaultRepoǁdescribed__mutmut_*",
            "scheduler_svc.store.faults.xǁFaultRepoǁby_ids__mutmut_*",
            "scheduler_svc.services.fabric.x__evidence_of__mutmut_*",
            "scheduler_svc.services.fabric.x_close_cleared__mutmut_*",
            "scheduler_svc.fleet.events.x_emit_decision__mutmut_*",
        ),
    ),
    Target(
        # Issue 29: an event and its deliveries written by Core, the session left unflushed
        # (the commands a switch point supersedes are written together at the commit).
        "outbox-writes",
        ("scheduler_svc/fleet/events.py", "scheduler_svc/fleet/repositories.py"),
        (
            "tests/fleet/test_outbox_writes.py",
            "tests/fleet/test_worker.py",
            "tests/fleet/test_actions.py",
            "tests/fleet/test_webhooks.py",
        ),
        only=(
            "scheduler_svc.fleet.events.x_emit__mutmut_*",
            "scheduler_svc.fleet.events.x_emit_command_change__mutmut_*",
            "scheduler_svc.fleet.repositories.xǁOutboxRepoǁadd__mutmut_*",
        ),
    ),
    Target(
        "group-commit",
        ("scheduler_svc/store/groupcommit.py",),
        ("tests/store/test_groupcommit.py",),
    ),
    Target(
        "collectors",
        ("agent/collectors/*.py",),
        (
            "tests/agent/test_agent_collectors.py",
            "tests/agent/test_counter_baseline.py",
            "tests/agent/test_collectors_strength.py",
            "tests/agent/test_collector_names.py",
            "tests/agent/test_collectors_supervise.py",
        ),
    ),
    Target(
        # Issue 28's engine rules: port levels in fault health, the held fail-back, the
        # checkpoint verdict across incarnations, the backups a fail-back overtaken keeps,
        # a rank left without any path where it was told,
        # and what a restart was decided for (a leaf with its ports as one failure, the
        # windows announced at the restart).
        "sequences",
        (
            "scheduler_svc/engine/fabric.py",
            "scheduler_svc/engine/reconcile.py",
            "scheduler_svc/engine/outcomes.py",
            "scheduler_svc/engine/job_routes.py",
            "scheduler_svc/engine/evidence.py",
        ),
        ("tests/engine",),
        only=(
            "scheduler_svc.engine.fabric.x_fault_health__mutmut_*",
            "scheduler_svc.engine.reconcile.x__held__mutmut_*",
            "scheduler_svc.engine.reconcile.x__stranded__mutmut_*",
            "scheduler_svc.engine.outcomes.x_at_checkpoint__mutmut_*",
            "scheduler_svc.engine.outcomes.x__repair_left__mutmut_*",
            "scheduler_svc.engine.outcomes.x__restart_at__mutmut_*",
            "scheduler_svc.engine.job_routes.x_backups_of__mutmut_*",
            "scheduler_svc.engine.job_routes.x_primary_ok__mutmut_*",
            "scheduler_svc.engine.evidence.x_isolated_by__mutmut_*",
            "scheduler_svc.engine.evidence.x_one_failure__mutmut_*",
            "scheduler_svc.engine.evidence.x_known__mutmut_*",
        ),
    ),
    Target(
        "engine",
        ("scheduler_svc/engine/*.py",),
        ("tests/engine",),
    ),
)


def tracked_files() -> list[str]:
    """What a fresh clone has (plus files not yet committed, so a new test counts)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],  # noqa: S607
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def score(killed: int, non_equivalent: int) -> float:
    """Per cent of the non-equivalent mutants killed, rounded down to a tenth: 100.0 only
    when none survived (4,331 of 4,333 is 99.9, where rounding would say 100.0)."""
    return math.floor(1000 * killed / non_equivalent) / 10 if non_equivalent else 100.0


def prepare(target: Target) -> Path:
    work = WORK / target.name
    if work.exists():
        shutil.rmtree(work)
    for rel in tracked_files():
        dest = work / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    built = ROOT / "native_plugin" / "build"
    if built.is_dir():  # the compiled plugin, for the tests that load it
        shutil.copytree(built, work / "native_plugin" / "build")
    lines = ["[mutmut]"]

    def option(key: str, values: Iterable[str]) -> None:
        lines.append(f"{key} =")
        lines.extend(f"    {v}" for v in values)

    option("source_paths", SOURCE_PATHS)
    option("only_mutate", target.files)
    option("also_copy", ("benchmarks", "openapi", "deploy", "examples", "README.md"))
    option("pytest_add_cli_args_test_selection", target.tests)
    # A mutant that makes a wait never end fails its test here, not after the suite's 300 s.
    option("pytest_add_cli_args", ("--timeout=60", "-p", "no:cacheprovider"))
    lines.append("use_git_change_detection = false")
    (work / "setup.cfg").write_text("\n".join(lines) + "\n")
    return work


def mutmut(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("mutmut")
    return subprocess.run(  # noqa: S603
        ["nice", "-n", "10", str(exe), *args],  # noqa: S607
        cwd=work,
        text=True,
        capture_output=True,
        check=False,
    )


@dataclass(frozen=True, slots=True)
class Equivalent:
    """A listed equivalent mutant: its name, why, and the change it makes.

    mutmut numbers a function's mutants in order, so any edit of the function renumbers
    them and a name alone may come to mean another mutant. An entry that records its
    change ("-" and "+" lines, stripped) matches only a survivor of the same function
    making that change, whatever its number now; one without (older entries) matches
    by name, and the run records its change.
    """

    name: str
    reason: str
    change: tuple[str, ...] = ()


@contextmanager
def shared_files() -> Iterator[None]:
    """Hold the lock on the files every run writes. A run reads them again under it and
    changes only its own part: two runs at once had each written back what it read at its
    start, and the later one dropped the other's rows and entries."""
    SHARED_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with SHARED_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def follow_equivalents(path: Path, followed: list[tuple[Equivalent, Equivalent]]) -> None:
    """Apply this run's renames and recorded changes (old entry -> new) to the entries as
    they are now, which another run may have changed meanwhile."""
    if not followed or not path.exists():
        return
    with shared_files():
        entries = read_equivalents(path.read_text())
        for old, new in followed:
            if old in entries:
                entries[entries.index(old)] = new
        write_equivalents(path, entries)


def record_result(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Write one target's result into the results and the table as they are now; all
    results after it."""
    with shared_files():
        results: dict[str, dict[str, Any]] = (
            json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
        )
        results[result["target"]] = result
        write_results(results)
    return results


def read_equivalents(text: str) -> list[Equivalent]:
    """Entries are `<name> <reason>` lines, each followed by its change, indented."""
    out: list[Equivalent] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if raw.startswith((" ", "\t")) and out and line[0] in "-+":
            last = out[-1]
            out[-1] = replace(last, change=(*last.change, line))
            continue
        name, _, reason = line.partition(" ")
        out.append(Equivalent(name, reason.strip()))
    return out


def write_equivalents(path: Path, entries: Iterable[Equivalent]) -> None:
    """Rewrite the entries after the file's header comments, each with its change."""
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    lines = list(header)
    for e in entries:
        lines.append(f"{e.name} {e.reason}")
        lines.extend(f"    {c}" for c in e.change)
    path.write_text("\n".join(lines) + "\n")


def change_of(diff: str) -> tuple[str, ...]:
    """The removed and added lines of a `mutmut show` diff, stripped after the sign."""
    return tuple(
        f"{ln[0]} {ln[1:].strip()}"
        for ln in diff.splitlines()
        if ln[:1] in ("-", "+") and not ln.startswith(("---", "+++"))
    )


def _function(name: str) -> str:
    return name.split("__mutmut_", maxsplit=1)[0]


def match_equivalent(
    name: str, change: tuple[str, ...], entries: Iterable[Equivalent]
) -> Equivalent | None:
    """The entry that says this survivor is equivalent, if one does (see Equivalent)."""
    entries = list(entries)
    for e in entries:
        if e.name == name and (not e.change or e.change == change):
            return e
    for e in entries:
        if e.change == change and _function(e.name) == _function(name):
            return e
    return None


# SQL keywords and identifiers are case-insensitive (SQLite and PostgreSQL alike).
_SQL = re.compile(
    r'"(SELECT|INSERT|DELETE|UPDATE|PRAGMA|BEGIN|COMMIT|ROLLBACK|VALUES|ON CONFLICT)\b'
)


def equivalent_by_rule(diff: str) -> str | None:
    """A reason when the mutant cannot change behaviour by construction, else None."""
    lines = diff.splitlines()
    removed = [ln[1:] for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    if (
        len(removed) == len(added) == 1
        and removed[0] != added[0]
        and removed[0].lower() == added[0].lower()
        and _SQL.search(removed[0])
    ):
        return "changes only the case of an SQL statement, which the database reads alike"
    return None


def outcomes(work: Path, target: Target) -> dict[str, str]:
    found: dict[str, str] = {}
    for meta in (work / "mutants").rglob("*.meta"):
        data = json.loads(meta.read_text())
        for name, code in data["exit_code_by_key"].items():
            if not target.only or any(fnmatch.fnmatch(name, p) for p in target.only):
                found[name] = status_by_exit_code[code]
    return found


def run_target(target: Target, workers: int = 1) -> dict[str, Any]:
    print(f"== {target.name}: mutating {', '.join(target.files)}", flush=True)
    started = time.monotonic()
    work = prepare(target)
    args = ["run", "--max-children", str(workers)]
    args.extend(target.only)
    proc = mutmut(work, *args)
    status = outcomes(work, target)
    if proc.returncode != 0 or not status:
        sys.stdout.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"mutmut failed for {target.name} (exit {proc.returncode})")
    listed = read_equivalents(EQUIVALENT.read_text()) if EQUIVALENT.exists() else []
    killed = [n for n, s in status.items() if s in ("killed", "timeout", "caught by type check")]
    alive = sorted(n for n in status if n not in killed)
    survived: list[str] = []
    equivalent: dict[str, str] = {}
    followed: list[tuple[Equivalent, Equivalent]] = []
    for name in alive:
        diff = mutmut(work, "show", name).stdout
        change = change_of(diff)
        entry = match_equivalent(name, change, listed)
        reason = entry.reason if entry is not None else equivalent_by_rule(diff)
        if reason is not None:
            equivalent[name] = reason
            if entry is not None and (entry.name, entry.change) != (name, change):
                if entry.name != name:
                    print(f"-- {entry.name} is now {name}: its entry follows it")
                elif not entry.change:
                    print(f"-- {name}: its change is recorded now; check the reason fits it:")
                    print(f"   {entry.reason}\n" + "\n".join(f"   {c}" for c in change))
                followed.append((entry, replace(entry, name=name, change=change)))
                listed[listed.index(entry)] = followed[-1][1]
            continue
        survived.append(name)
        print(f"-- survived: {name} ({status[name]})\n{diff}")
    follow_equivalents(EQUIVALENT, followed)  # names followed, changes recorded
    non_equivalent = len(status) - len(equivalent)
    result = {
        "target": target.name,
        "files": list(target.files),
        "tests": list(target.tests),
        "mutants": len(status),
        "killed": len(killed),
        "equivalent": len(equivalent),
        "survived": len(survived),
        "score": score(len(killed), non_equivalent),
        "survivors": survived,
        "minutes": round((time.monotonic() - started) / 60, 1),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }
    print(
        f"{target.name}: {result['killed']} killed, {result['survived']} survived, "
        f"{result['equivalent']} equivalent of {result['mutants']} "
        f"({result['score']}% of the non-equivalent killed)",
        flush=True,
    )
    return result


def function_of(pattern: str) -> str:
    """`pkg.mod.xǁClassǁmethod__mutmut_*` -> `Class.method` (mutmut's mangled names)."""
    mangled = pattern.rsplit(".", 1)[1].split("__mutmut_", maxsplit=1)[0]
    if mangled.startswith("xǁ"):
        return mangled[2:].replace("ǁ", ".")
    return mangled.removeprefix("x_")


def render(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        SECTION,
        "",
        "`make mutation` (mutmut, one worker, niced, on a 2-core machine that is usually",
        "running other work too, so the minutes vary). Each target's files are mutated one",
        "change at a time and run against the tests listed; equivalent survivors, each with",
        "its reason, are in `scripts/mutation_equivalent.txt` (SQL case changes are",
        "recognised by the script). After a run, `cd build/mutation/<target> &&",
        "../../../.venv/bin/mutmut results` lists every survivor, and `scripts/mutation.py",
        "<target> --only PATTERN` re-runs some functions' mutants alone.",
        "",
        "| target | mutated | tests | mutants | killed | equivalent | survived | killed of "
        "non-equivalent | minutes | date |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for t in TARGETS:
        r = results.get(t.name)
        if r is None:
            continue
        mutated = ", ".join(r["files"])
        if t.only:
            mutated += " (" + ", ".join(function_of(p) for p in t.only) + " only)"
        rows.append(
            f"| {t.name} | {mutated} | {', '.join(r['tests'])} | {r['mutants']} "
            f"| {r['killed']} | {r['equivalent']} | {r['survived']} | {r['score']}% "
            f"| {r['minutes']} | {r['date']} |"
        )
    survivors = [s for t in TARGETS for s in results.get(t.name, {}).get("survivors", [])]
    if survivors:
        rows += ["", "Survivors still to kill: " + ", ".join(f"`{s}`" for s in survivors)]
    return "\n".join(rows) + "\n"


# Written by hand under the table: each run keeps this paragraph and what follows it.
NOTES = "Notes on the rows"


def write_results(results: dict[str, dict[str, Any]]) -> None:
    RESULTS_JSON.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    RESULTS_MD.write_text(with_section(RESULTS_MD.read_text(), render(results)))


def with_section(text: str, section: str) -> str:
    """`text` with its Test strength section replaced by `section`, the notes kept."""
    start = text.find(SECTION + "\n")
    if start == -1:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", start + len(SECTION))
    old = text[start:] if end == -1 else text[start:end]
    notes = old.find("\n" + NOTES)
    if notes != -1:
        section += old[notes:].rstrip("\n") + "\n"
    return text[:start] + section + ("" if end == -1 else text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=", ".join(t.name for t in TARGETS))
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="run only the mutants whose names match (fnmatch; repeatable) and print the "
        "outcome; the table, whose rows are whole targets, is left as it is",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="mutants tested at once (default 1: the machine is usually shared)",
    )
    args = parser.parse_args()
    names = args.targets or [t.name for t in TARGETS]
    unknown = set(names) - {t.name for t in TARGETS}
    if unknown:
        parser.error(f"unknown targets: {', '.join(sorted(unknown))}")
    os.environ.setdefault("RAILOVER_REQUIRE_TOOLS", "1")
    os.environ.setdefault("RAILOVER_HYPOTHESIS_PROFILE", "mutation")  # tests/conftest.py
    if args.only:
        for target in TARGETS:
            if target.name in names:  # its own copy: a whole-target run may be going on
                only = replace(target, name=f"{target.name}-only", only=tuple(args.only))
                run_target(only, args.workers)
        return
    results: dict[str, dict[str, Any]] = {}
    for target in TARGETS:
        if target.name in names:
            # after each target: a long run keeps what it has
            results = record_result(run_target(target, args.workers))
    for t in TARGETS:
        if t.name in results:
            r = results[t.name]
            print(
                f"{t.name:>18}: {r['killed']:4} killed {r['survived']:4} survived "
                f"{r['equivalent']:4} equivalent  {r['score']}%"
            )


if __name__ == "__main__":
    main()

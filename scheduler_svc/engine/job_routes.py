"""One job's routes under the fabric, and the lookups the outcomes make in them.

`routes_of` routes every rank of the job (with the job's index, only the ranks a fault
touches: the same answer); the rest read a rank's route, its backup, or the bandwidth
the worst-off rank keeps, without walking every route when an index is there.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_svc.engine import jobindex
from scheduler_svc.engine.jobindex import build, route_of
from scheduler_svc.engine.routes import (
    Connectivity,
    JobIndex,
    RankRoute,
    bandwidth_left,
    connectivity,
    route_ranks,
)
from scheduler_svc.engine.state import FabricView, JobState, comms_of


def routes_of(job: JobState, fabric: FabricView, index: JobIndex | None = None) -> Connectivity:
    """Every rank's route and the pairs left; from the ranks the faults touch given an index
    built for this job and these plans (the same answer, in O(touched ranks))."""
    if index is not None and index_fits(index, job, fabric):
        return jobindex.connectivity(index, fabric.failed, fabric.plans, fabric.topologies)
    return connectivity(route_ranks(job.ranks, fabric.plans, fabric.topologies, fabric.failed))


def index_for(job: JobState, fabric: FabricView) -> JobIndex:
    """The job's index on the fabric's plans: built once per placement and plans, then kept."""
    return build(job.ranks, fabric.plans, fabric.topologies, comms_of(job))


def index_fits(index: JobIndex, job: JobState, fabric: FabricView) -> bool:
    """Whether `index` was built for this job's placement and communicators on these plans."""
    return index.fits(job.ranks, comms_of(job)) and index.built_on(fabric.plans, fabric.topologies)


def backups_of(conn: Connectivity, ranks: Sequence[int]) -> dict[int, str]:
    """The backup RNIC of each of `ranks` that has one."""
    wanted = set(ranks)
    routes = routes_by_rank(conn, ranks)
    return {r: route.backup for r, route in routes.items() if r in wanted and route.backup}


def primary_ok(conn: Connectivity, ranks: Sequence[int]) -> set[int]:
    """Those of `ranks` whose primary works now."""
    return {
        r for r, route in routes_by_rank(conn, ranks).items() if r in ranks and route.primary_ok
    }


def routes_by_rank(conn: Connectivity, ranks: Sequence[int]) -> dict[int, RankRoute]:
    """The routes of `ranks` that the job has: all of them without an index."""
    if conn.index is None:
        return {r.rank: r for r in conn.routes}
    found = {r: route_of(conn, r) for r in ranks}
    return {r: route for r, route in found.items() if route is not None}


def job_bandwidth_left(conn: Connectivity, fabric: FabricView) -> float:
    """routes.bandwidth_left; with an index, over the nodes where some rank lacks an endpoint.

    A rank on any other node uses its primary as every rank there does, and keeps all of
    its bandwidth (a ratio of exactly 1), so those nodes cannot lower the minimum.
    """
    index = conn.index
    if index is None or conn.odd is None:
        return bandwidth_left(conn.routes, fabric.topologies)
    nodes = {conn.routes[i].node for i in conn.odd}
    at = sorted(i for n in nodes for i in index.by_node.get(n, ()))
    return bandwidth_left([conn.routes[i] for i in at], fabric.topologies)

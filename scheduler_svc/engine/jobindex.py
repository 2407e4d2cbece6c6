"""A job's placement indexed once, so that one fault costs the ranks it touches (issue 12).

`build` routes every rank on the healthy fabric and keeps what a fault needs to
find the ranks it can touch: ranks by node, by (node, device), by fabric switch
and by GPU; per rail and per (rail, node) the count of ranks in each endpoint
class; each communicator's members. `connectivity` then routes again only the
ranks a failed part can touch, adjusts the counts, and returns exactly what
`routes.connectivity(routes.route_ranks(...))` returns for the whole job: the same
routes, pairs, isolated and failed-over ranks and examples.

Pure, like the rest of the engine: an index is a function of the job's ranks, its
communicators and its nodes' plans and topologies. The service builds one when a
job is registered or one of its nodes registers again, and keys it by the same
versions as the s-Bond plans, so every replica agrees on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from scheduler_svc.engine.paths import FailedSet, NodePlan, NodeTopology
from scheduler_svc.engine.routes import (
    BACKUP,
    BOTH,
    NONE,
    CommIndex,
    Connectivity,
    JobIndex,
    Positions,
    RankRoute,
    endpoint_class,
    pair_counts,
    pair_survives,
    route_ranks,
    specs_of,
    talks_over_fabric,
)


def _codes(keys: Sequence[object]) -> tuple[dict[object, int], np.ndarray]:
    """Each distinct key numbered in order of first appearance, and the keys as numbers."""
    codes: dict[object, int] = {}
    coded = np.fromiter((codes.setdefault(k, len(codes)) for k in keys), np.int64, len(keys))
    return codes, coded


def _groups(keys: Sequence[object]) -> dict[object, Positions]:
    """Positions of equal keys, each group in ascending order (numpy does the sort)."""
    codes, coded = _codes(keys)
    flat = np.argsort(coded, kind="stable").tolist()
    ends = np.cumsum(np.bincount(coded, minlength=len(codes))).tolist()
    out: dict[object, Positions] = {}
    start = 0
    for name, end in zip(codes, ends, strict=True):
        out[name] = tuple(flat[start:end])
        start = end
    return out


def _multi_groups(pairs: Iterable[tuple[object, int]]) -> dict[object, Positions]:
    """Like `_groups`, for keys that name a position more than once (in ascending order):
    each group holds its positions once."""
    out: dict[object, list[int]] = {}
    for key, pos in pairs:
        group = out.get(key)
        if group is None:
            out[key] = [pos]
        elif group[-1] != pos:
            group.append(pos)
    return {k: tuple(v) for k, v in out.items()}


def build(
    ranks: Sequence[tuple[int, str, int]],
    plans: Mapping[str, NodePlan],
    topologies: Mapping[str, NodeTopology],
    communicators: Sequence[object] = (),
) -> JobIndex:
    """Index a job's placement on its nodes' plans; raises ValueError on a repeated rank."""
    ranks = tuple(ranks)
    healthy = tuple(route_ranks(ranks, plans, topologies, FailedSet()))
    positions = {r: i for i, (r, _, _) in enumerate(ranks)}
    nodes = frozenset(n for _, n, _ in ranks)
    if len(positions) != len(ranks):
        raise ValueError("a rank is placed twice")
    classes = np.fromiter((endpoint_class(r) for r in healthy), np.int8, len(healthy))
    rails = [r.rail for r in healthy]
    rail_counts = _count(rails, classes)
    node_counts = _count([(r.rail, r.node) for r in healthy], classes)
    broken_rail, total_rail = pair_counts({k: list(v) for k, v in rail_counts.items()})
    broken_local, total_local = pair_counts({k: list(v) for k, v in node_counts.items()})
    device_pairs, switch_pairs, ports = _endpoints(healthy, topologies)
    by_switch = _multi_groups(switch_pairs)
    comms = tuple(_comm_index(c, ranks, positions) for c in communicators)
    return JobIndex(
        ranks=ranks,
        healthy=healthy,
        positions=positions,
        nodes=nodes,
        by_node=_groups([n for _, n, _ in ranks]),  # type: ignore[arg-type]  # str keys
        by_device=_multi_groups(device_pairs),  # type: ignore[arg-type]  # (node, device)
        by_switch=by_switch,  # type: ignore[arg-type]  # str keys
        by_gpu=_groups([(n, g) for _, n, g in ranks]),  # type: ignore[arg-type]  # (node, gpu)
        by_rail=_groups(rails),  # type: ignore[arg-type]  # rail keys
        odd=tuple(np.flatnonzero(classes != BOTH).tolist()),
        rail_counts=rail_counts,  # type: ignore[arg-type]  # rail keys
        node_counts=node_counts,  # type: ignore[arg-type]  # (rail, node) keys
        broken_rail=broken_rail,
        total_rail=total_rail,
        broken_local=broken_local,
        total_local=total_local,
        ports_by_node={n: frozenset(v) for n, v in ports.items()},
        used_switches=frozenset(by_switch),  # type: ignore[arg-type]  # str keys
        used_gpus=frozenset((n, g) for _, n, g in ranks),
        rank_node={r: n for r, n, _ in ranks},
        ranks_in_order=tuple(r for r, _, _ in ranks),
        sorted_ranks=tuple(sorted(positions)),
        comms=comms,
        comm_specs=specs_of(communicators),
        plans=plans,
        topologies=topologies,
        warnings=tuple(w for n in sorted(plans) for w in plans[n].warnings),
    )


def _endpoints(
    healthy: Sequence[RankRoute], topologies: Mapping[str, NodeTopology]
) -> tuple[list[tuple[object, int]], list[tuple[object, int]], dict[str, set[tuple[str, int]]]]:
    """Each rank's primary and backup: (RNIC, position) and (switch, position) pairs, and
    the ports each node uses."""
    device_pairs: list[tuple[object, int]] = []
    switch_pairs: list[tuple[object, int]] = []
    ports: dict[str, set[tuple[str, int]]] = {}
    for i, r in enumerate(healthy):
        for key in (r.primary, r.backup):
            if key is None:
                continue
            dev, _, port = key.partition("/")  # as evidence._uses reads a key
            ports.setdefault(r.node, set()).add((dev, int(port)))
            device_pairs.append(((r.node, dev), i))
            # route_ranks gave this endpoint from the node's plan, so its topology has it.
            switch = topologies[r.node].rnic(key).switch
            if switch is not None:
                switch_pairs.append((switch, i))
    return device_pairs, switch_pairs, ports


def _count(keys: Sequence[object], classes: np.ndarray) -> dict[object, tuple[int, int, int, int]]:
    """Per key, how many of its positions are in each endpoint class."""
    codes, coded = _codes(keys)
    counts = np.bincount(coded * 4 + classes, minlength=4 * len(codes)).reshape(-1, 4).tolist()
    return {name: tuple(c) for name, c in zip(codes, counts, strict=True)}  # type: ignore[misc]


def _comm_index(
    comm: object, ranks: tuple[tuple[int, str, int], ...], positions: Mapping[int, int]
) -> CommIndex:
    spec = tuple(comm.ranks)  # type: ignore[attr-defined]  # CommSpec
    members = tuple(r for r in (spec or sorted(positions)) if r in positions)
    order: dict[int, int] = {}
    for i, r in enumerate(members):
        order.setdefault(r, i)
    told = frozenset(spec or (r for r, _, _ in ranks))
    return CommIndex(
        comm_id=comm.comm_id,  # type: ignore[attr-defined]  # CommSpec
        ranks=members,
        order=order,
        unique=len(order) == len(members),
        nodes=len({ranks[positions[r]][1] for r in order}),
        told=told,
        told_sorted=tuple(sorted(told)),
    )


def touched(index: JobIndex, failed: FailedSet) -> set[int]:
    """Positions of the ranks whose primary or backup some part of `failed` can take out."""
    out: set[int] = set()
    for node, dev in failed.rnics:
        if dev == "*":
            out.update(index.by_node.get(node, ()))
        else:
            out.update(index.by_device.get((node, dev), ()))
    for node, dev, _ in failed.links:
        out.update(index.by_device.get((node, dev), ()))
    for sw in failed.switches:
        out.update(index.by_switch.get(sw, ()))
    for key in failed.gpus:
        out.update(index.by_gpu.get(key, ()))
    return out


def connectivity(
    index: JobIndex,
    failed: FailedSet,
    plans: Mapping[str, NodePlan],
    topologies: Mapping[str, NodeTopology],
    max_examples: int = 10,
) -> Connectivity:
    """`routes.connectivity(route_ranks(...))` for the job, from the ranks `failed` touches."""
    changed: dict[int, RankRoute] = {}
    for i in sorted(touched(index, failed)):
        (now,) = route_ranks([index.ranks[i]], plans, topologies, failed)
        if now != index.healthy[i]:
            changed[i] = now
    routes = _with(index.healthy, changed)
    rail_counts, node_counts = index.rail_counts, index.node_counts
    rails: dict[object, list[int]] = {}
    locals_: dict[object, list[int]] = {}
    for i, now in changed.items():
        was = index.healthy[i]
        rail_key: object = was.rail
        node_key: object = (was.rail, was.node)
        r = rails.setdefault(rail_key, list(rail_counts[was.rail]))
        n = locals_.setdefault(node_key, list(node_counts[(was.rail, was.node)]))
        r[endpoint_class(was)] -= 1
        r[endpoint_class(now)] += 1
        n[endpoint_class(was)] -= 1
        n[endpoint_class(now)] += 1
    before_r, _ = pair_counts({k: list(index.rail_counts[k]) for k in rails})  # type: ignore[index]
    after_r, _ = pair_counts(rails)
    before_l, _ = pair_counts({k: list(index.node_counts[k]) for k in locals_})  # type: ignore[index]
    after_l, _ = pair_counts(locals_)
    broken = (index.broken_rail - before_r + after_r) - (index.broken_local - before_l + after_l)
    odd = sorted(set(index.odd) | {i for i, r in changed.items() if endpoint_class(r) != BOTH})
    isolated = [i for i in odd if endpoint_class(routes[i]) == NONE]
    backups = [i for i in odd if endpoint_class(routes[i]) == BACKUP]
    examples = []
    if broken:
        examples = _examples(index, routes, isolated, backups, odd, max_examples=max_examples)
    return Connectivity(
        routes=routes,
        broken_pairs=broken,
        total_pairs=index.total_rail - index.total_local,
        isolated_ranks=tuple(routes[i].rank for i in isolated),
        failed_over_ranks=tuple(routes[i].rank for i in backups),
        examples=tuple(sorted(set(examples))),
        odd=tuple(odd),
        index=index,
    )


def _with(routes: tuple[RankRoute, ...], changed: Mapping[int, RankRoute]) -> tuple[RankRoute, ...]:
    """`routes` with the changed ones replaced (two copies of the pointers, in C)."""
    if not changed:
        return routes
    out = list(routes)
    for i, r in changed.items():
        out[i] = r
    return tuple(out)


def _examples(
    index: JobIndex,
    routes: Sequence[RankRoute],
    isolated: Sequence[int],
    backups: Sequence[int],
    odd: Sequence[int],
    *,
    max_examples: int,
) -> list[tuple[int, int]]:
    """The example pairs `routes.connectivity` finds, in its order, looking only where they can be.

    A rank without an endpoint breaks with every rank of its rail on another node, so
    its partners are looked for along the rail; a rank left only its backup breaks only
    with ranks that lost theirs, which are among the odd ones.
    """
    examples: list[tuple[int, int]] = []
    lost = set(isolated)
    for a_pos in [*isolated, *backups]:
        a = routes[a_pos]
        partners = index.by_rail.get(a.rail, ()) if a_pos in lost else odd
        for b_pos in partners:
            b = routes[b_pos]
            if talks_over_fabric(a, b) and not pair_survives(a, b):
                examples.append((min(a.rank, b.rank), max(a.rank, b.rank)))
                if len(examples) >= max_examples:
                    return examples
    return examples


def route_of(conn: Connectivity, rank: int) -> RankRoute | None:
    """One rank's route, by the index when the connectivity has one."""
    if conn.index is not None:
        at = conn.index.positions.get(rank)
        return None if at is None else conn.routes[at]
    for r in conn.routes:
        if r.rank == rank:
            return r
    return None


def odd_routes(conn: Connectivity) -> Sequence[RankRoute]:
    """Every route that lacks an endpoint, in the job's order; all routes without an index."""
    if conn.odd is None:
        return conn.routes
    return [conn.routes[i] for i in conn.odd]

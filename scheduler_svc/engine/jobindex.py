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

`build` makes only what a pass on the healthy fabric reads (the routes, the counts of
pairs, the communicators): a third of the time of making everything, for a 65,536-rank
job. What only a fault reads (`routes.Lookups`: the ranks by device, switch and GPU, the
per-node counts, the ports used) is made once, on its first read; the service reads it
right after a registration's answer (`JobIndex.warm`), so neither the registration nor
the first fault waits for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np

from scheduler_svc.engine.paths import FailedSet, NodePlan, NodeTopology
from scheduler_svc.engine.routes import (
    BACKUP,
    BOTH,
    NONE,
    CommIndex,
    Connectivity,
    JobIndex,
    Lookups,
    NodeFailures,
    Once,
    Positions,
    RankRoute,
    class_pairs,
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


def _grouped(codes: Mapping[object, int], coded: np.ndarray) -> dict[object, Positions]:
    """Positions of equal keys (numbered by `_codes`), each group in ascending order
    (numpy does the sort)."""
    flat = np.argsort(coded, kind="stable").tolist()
    ends = np.cumsum(np.bincount(coded, minlength=len(codes))).tolist()
    out: dict[object, Positions] = {}
    start = 0
    for name, end in zip(codes, ends, strict=True):
        out[name] = tuple(flat[start:end])
        start = end
    return out


def _once_each(keys: Sequence[object]) -> dict[object, Positions]:
    """`_grouped` of keys that are most often all distinct (a job's GPUs: one rank each)."""
    out: dict[object, Positions] = {key: (i,) for i, key in enumerate(keys)}
    return out if len(out) == len(keys) else _grouped(*_codes(keys))


def build(
    ranks: Sequence[tuple[int, str, int]],
    plans: Mapping[str, NodePlan],
    topologies: Mapping[str, NodeTopology],
    communicators: Sequence[object] = (),
) -> JobIndex:
    """Index a job's placement on its nodes' plans; raises ValueError on a repeated rank.

    What a pass on the healthy fabric reads is made here; what only a fault reads
    (`Lookups`) on its first read, or by `JobIndex.warm`."""
    ranks = tuple(ranks)
    positions = {r: i for i, (r, _, _) in enumerate(ranks)}
    if len(positions) != len(ranks):
        raise ValueError("a rank is placed twice")
    healthy = tuple(route_ranks(ranks, plans, topologies, FailedSet()))
    classes = np.fromiter((endpoint_class(r) for r in healthy), np.int8, len(healthy))
    rails = [r.rail for r in healthy]
    rail_codes = _codes(rails)  # numbered once: counted, grouped and paired with nodes
    rail_counts = _count(*rail_codes, classes)
    node_codes = _codes([n for _, n, _ in ranks])
    by_node: dict[str, Positions] = _grouped(*node_codes)  # type: ignore[assignment]
    broken_rail, total_rail = pair_counts({k: list(v) for k, v in rail_counts.items()})
    broken_local, total_local = class_pairs(_class_counts(node_codes[1], rail_codes, classes))
    sorted_ranks = tuple(sorted(positions))
    comms = tuple(
        _comm_index(c, ranks, positions, sorted_ranks, len(by_node)) for c in communicators
    )
    return JobIndex(
        ranks=ranks,
        healthy=healthy,
        positions=positions,
        nodes=frozenset(by_node),
        by_node=by_node,
        by_rail=_grouped(*rail_codes),  # type: ignore[arg-type]  # rail keys
        odd=tuple(np.flatnonzero(classes != BOTH).tolist()),
        rail_counts=rail_counts,  # type: ignore[arg-type]  # rail keys
        broken_rail=broken_rail,
        total_rail=total_rail,
        broken_local=broken_local,
        total_local=total_local,
        lookups=Once(partial(_lookups, ranks, healthy, by_node, classes, topologies)),
        rank_node={r: n for r, n, _ in ranks},
        ranks_in_order=tuple(r for r, _, _ in ranks),
        sorted_ranks=sorted_ranks,
        comms=comms,
        comm_specs=specs_of(communicators),
        plans=plans,
        topologies=topologies,
        warnings=tuple(w for n in sorted(plans) for w in plans[n].warnings),
    )


def _class_counts(
    nodes: np.ndarray, rails: tuple[Mapping[object, int], np.ndarray], classes: np.ndarray
) -> np.ndarray:
    """Per (rail, node) of the ranks (both numbered by `_codes`), how many are in each
    endpoint class: one row each."""
    rail_codes, rail_coded = rails
    groups, group = np.unique(nodes * len(rail_codes) + rail_coded, return_inverse=True)
    return np.bincount(group * 4 + classes, minlength=4 * len(groups)).reshape(-1, 4)


def _lookups(
    ranks: Sequence[tuple[int, str, int]],
    healthy: Sequence[RankRoute],
    by_node: Mapping[str, Positions],
    classes: np.ndarray,
    topologies: Mapping[str, NodeTopology],
) -> Lookups:
    """The index's `Lookups`, read node by node."""
    by_device: dict[tuple[str, str], Positions] = {}
    switches: dict[str, list[int]] = {}
    ports: dict[str, frozenset[tuple[str, int]]] = {}
    counts: dict[tuple[int | None, str], tuple[int, int, int, int]] = {}
    class_of = classes.tolist()
    for node, at in by_node.items():
        # A node has a few endpoint keys, each read once: (device, port, switch).
        known: dict[str, tuple[str, int, str | None]] = {}
        devices: dict[str, list[int]] = {}
        behind: dict[str, list[int]] = {}
        per_rail: dict[int | None, list[int]] = {}
        for i in at:
            r = healthy[i]
            c = per_rail.get(r.rail)
            if c is None:
                c = per_rail[r.rail] = [0, 0, 0, 0]
            c[class_of[i]] += 1
            primary = None
            if r.primary is not None:
                primary = known.get(r.primary) or _endpoint(known, topologies, node, r.primary)
                devices.setdefault(primary[0], []).append(i)
                if primary[2] is not None:
                    behind.setdefault(primary[2], []).append(i)
            if r.backup is not None:
                backup = known.get(r.backup) or _endpoint(known, topologies, node, r.backup)
                # A rank's primary and backup on one device, or behind one switch, count once.
                if primary is None or backup[0] != primary[0]:
                    devices.setdefault(backup[0], []).append(i)
                if backup[2] is not None and (primary is None or backup[2] != primary[2]):
                    behind.setdefault(backup[2], []).append(i)
        for dev, positions in devices.items():
            by_device[(node, dev)] = tuple(positions)
        for switch, positions in behind.items():
            switches.setdefault(switch, []).extend(positions)
        if known:
            ports[node] = frozenset((dev, port) for dev, port, _ in known.values())
        for rail, c in per_rail.items():
            counts[(rail, node)] = (c[0], c[1], c[2], c[3])
    # A switch's positions, node after node, are ascending unless the job's ranks
    # interleave its nodes (sorting what is in order costs one pass).
    by_switch = {s: tuple(sorted(p)) for s, p in switches.items()}
    by_gpu = _once_each([(n, g) for _, n, g in ranks])
    return Lookups(
        by_device=by_device,
        by_switch=by_switch,
        by_gpu=by_gpu,  # type: ignore[arg-type]  # (node, gpu) keys
        node_counts=counts,
        ports_by_node=ports,
        used_switches=frozenset(by_switch),
        used_gpus=frozenset(by_gpu),  # type: ignore[arg-type]  # (node, gpu) keys
    )


def _endpoint(
    known: dict[str, tuple[str, int, str | None]],
    topologies: Mapping[str, NodeTopology],
    node: str,
    key: str,
) -> tuple[str, int, str | None]:
    """A node's endpoint key read as (device, port, switch), and kept in `known`."""
    dev, _, port = key.partition("/")  # as evidence._uses reads a key
    # route_ranks gave this endpoint from the node's plan, so its topology has it.
    known[key] = found = (dev, int(port), topologies[node].rnic(key).switch)
    return found


def _count(
    codes: Mapping[object, int], coded: np.ndarray, classes: np.ndarray
) -> dict[object, tuple[int, int, int, int]]:
    """Per key (numbered by `_codes`), how many of its positions are in each endpoint class."""
    counts = np.bincount(coded * 4 + classes, minlength=4 * len(codes)).reshape(-1, 4).tolist()
    return {name: tuple(c) for name, c in zip(codes, counts, strict=True)}  # type: ignore[misc]


def _comm_index(
    comm: object,
    ranks: tuple[tuple[int, str, int], ...],
    positions: Mapping[int, int],
    sorted_ranks: tuple[int, ...],
    nodes: int,
) -> CommIndex:
    spec = tuple(comm.ranks)  # type: ignore[attr-defined]  # CommSpec
    if not spec:  # every rank of the job, each once: what the general case finds, read off
        return CommIndex(
            comm_id=comm.comm_id,  # type: ignore[attr-defined]  # CommSpec
            ranks=sorted_ranks,
            order={r: i for i, r in enumerate(sorted_ranks)},
            unique=True,
            nodes=nodes,
            told=frozenset(positions),
            told_sorted=sorted_ranks,
        )
    members = tuple(r for r in spec if r in positions)
    order: dict[int, int] = {}
    for i, r in enumerate(members):
        order.setdefault(r, i)
    told = frozenset(spec)
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
    changed = _changed(index, failed, plans, topologies)
    routes = _with(index.healthy, changed)
    rail_counts = index.rail_counts
    node_counts = index.node_counts if changed else {}  # a lookup: made only for a change
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
    before_r, _ = pair_counts({k: list(rail_counts[k]) for k in rails})  # type: ignore[index]
    after_r, _ = pair_counts(rails)
    before_l, _ = pair_counts({k: list(node_counts[k]) for k in locals_})  # type: ignore[index]
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


def _changed(
    index: JobIndex,
    failed: FailedSet,
    plans: Mapping[str, NodePlan],
    topologies: Mapping[str, NodeTopology],
) -> dict[int, RankRoute]:
    """The routes, by position in order, of the ranks `failed` touches that are not their
    healthy ones.

    Node by node: a rank's route depends only on its node's plan (the index's own) and
    on what fails on that node or on a switch its ports are cabled to. So each node's
    answer is kept on the index with those failures (`JobIndex.routed`) and given again
    while they are the same: with a hundred faults open, a new one routes the ranks of
    its own node (or switch), not those of the hundred.
    """
    on_node: dict[str, list[int]] = {}
    for i in touched(index, failed):
        on_node.setdefault(index.ranks[i][1], []).append(i)
    own = _failures_by_node(failed)
    changed: dict[int, RankRoute] = {}
    for node, positions in on_node.items():
        was = index.routed.get(node)
        switches = _switches(topologies.get(node)) if was is None else was[0]
        failures: NodeFailures = (own.get(node, frozenset()), failed.switches & switches)
        if was is not None and was[1] == failures:
            changed.update(was[2])
            continue
        mine = {}
        for i in positions:
            (now,) = route_ranks([index.ranks[i]], plans, topologies, failed)
            if now != index.healthy[i]:
                mine[i] = now
        index.routed[node] = (switches, failures, mine)
        changed.update(mine)
    return dict(sorted(changed.items()))


def _failures_by_node(failed: FailedSet) -> dict[str, frozenset[tuple[object, ...]]]:
    """Each node's own failed parts: ("r", device) for an RNIC ("*": all of them), ("l",
    device, port) for a link, ("g", gpu) for a GPU."""
    out: dict[str, set[tuple[object, ...]]] = {}
    for node, dev in failed.rnics:
        out.setdefault(node, set()).add(("r", dev))
    for node, dev, port in failed.links:
        out.setdefault(node, set()).add(("l", dev, port))
    for node, gpu in failed.gpus:
        out.setdefault(node, set()).add(("g", gpu))
    return {node: frozenset(parts) for node, parts in out.items()}


def _switches(topology: NodeTopology | None) -> frozenset[str]:
    """The fabric switches a node's ports are cabled to (none for a node not known)."""
    if topology is None:
        return frozenset()
    return frozenset(r.switch for r in topology.rnics if r.switch is not None)


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

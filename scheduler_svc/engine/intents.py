"""Commands: the difference between what the ranks were told and the desired state.

`command_diff` turns that difference into `Intent`s, one per command to send (a
switch point for every rank of a communicator when its channel plan changes);
`transit_refused` and `failback_refused` say what the ranks were told once they
refused a command.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace
from typing import Any

from scheduler_svc.engine.routes import JobIndex
from scheduler_svc.engine.state import IMPLICIT_COMM, Desired, JobState, Mode, comms_of


class IntentKind(enum.StrEnum):
    FAILOVER = "failover"
    REBALANCE = "rebalance"
    FAILBACK = "failback"
    ABORT = "abort"
    BALANCE = "balance"
    NVL_TRANSIT = "nvl_transit"
    CHECKPOINT_NOW = "checkpoint_now"


@dataclass(frozen=True, slots=True)
class Intent:
    """One command to send: to these ranks of one communicator (a switch point when coordinated)."""

    kind: IntentKind
    comm_id: int
    ranks: tuple[int, ...]
    disabled_channels: tuple[int, ...] = ()
    # BALANCE: each channel's share and the allreduce hand-off (disabled_channels is the
    # DCR plan a CCL without weights runs instead).
    weights: tuple[float, ...] = ()
    split_ratio: float = 0.0
    # NVL_TRANSIT: (rank, transit GPU) for each of `ranks`.
    transit: tuple[tuple[int, int], ...] = ()
    iteration: int | None = None  # CHECKPOINT_NOW: the checkpoint must be newer than this
    # FAILBACK: the ranks it returns to their primary (`ranks` is every member it tells).
    returning: tuple[int, ...] = ()

    @property
    def coordinated(self) -> bool:
        return self.kind in (IntentKind.REBALANCE, IntentKind.FAILBACK, IntentKind.BALANCE)


def command_diff(
    commanded: Desired,
    desired: Desired,
    job: JobState,
    index: JobIndex | None = None,
) -> list[Intent]:
    """What to tell the ranks so that what they were told becomes `desired`.

    Aborting covers everything; otherwise ranks newly off their primary are told to
    move at once (s-Bond needs no agreement), and each communicator whose channel plan
    changes, or that has ranks returning to their primary, gets one switch point for all
    its ranks, carrying the channels that stay disabled: a BALANCE with the channel
    weights and allreduce split when balance is the plan, else a REBALANCE. Ranks given
    a new transit GPU are told at once (NVL_TRANSIT: a rank's own path, no agreement).
    A checkpoint request that changed goes to every rank (comm 0: the process, not one
    communicator).

    With the job's `index` (built for this placement and these communicators) the
    members of each communicator are read from it, not gathered again.
    """
    if index is not None and not index.fits(job.ranks, comms_of(job)):
        index = None
    all_ranks = tuple(r for r, _, _ in job.ranks) if index is None else index.ranks_in_order
    comms = [(c.comm_id, c.ranks or all_ranks) for c in comms_of(job)]
    if desired.mode == Mode.RESTARTING:
        if commanded.mode == Mode.RESTARTING:
            return []
        return [Intent(IntentKind.ABORT, cid, tuple(ranks)) for cid, ranks in comms]
    intents: list[Intent] = []
    newly = {r for r, k in desired.moved.items() if commanded.moved.get(r) != k}
    back = {r for r in commanded.moved if r not in desired.moved}
    for k, (cid, ranks) in enumerate(comms):
        members: Set[int] = set(ranks) if index is None else index.comms[k].told
        moving = tuple(sorted(newly & members))
        if moving:
            intents.append(Intent(IntentKind.FAILOVER, cid, moving))
        now = tuple(desired.disabled.get(cid, ()))
        returning = back & members
        if cid == IMPLICIT_COMM and not job.communicators:
            # No registered communicator: no channel plan to agree on, so each rank is told
            # its own return; a rank whose primary is still failed is told nothing.
            if returning:
                back_ranks = tuple(sorted(returning))
                intents.append(
                    Intent(IntentKind.FAILBACK, cid, back_ranks, now, returning=back_ranks)
                )
            continue
        told = _switch_point(
            commanded, desired, cid, returning=returning, members=members, index=index, k=k
        )
        if told is not None:
            intents.append(told)
        intents.extend(_transit_changes(commanded, desired, cid, members))
    asked = desired.checkpoint_after
    if asked is not None and asked != commanded.checkpoint_after:
        everyone = tuple(sorted(all_ranks)) if index is None else index.sorted_ranks
        intents.append(Intent(IntentKind.CHECKPOINT_NOW, 0, everyone, iteration=asked))
    return intents


def _switch_point(
    commanded: Desired,
    desired: Desired,
    cid: int,
    *,
    returning: Set[int],
    members: Set[int],
    index: JobIndex | None,
    k: int,
) -> Intent | None:
    """The one switch point of registered communicator `cid` (the `k`th of the job), to
    all its `members`: a FAILBACK when ranks return, else a BALANCE or REBALANCE when its
    channel plan changed."""
    was = tuple(commanded.disabled.get(cid, ()))
    now = tuple(desired.disabled.get(cid, ()))
    weights = tuple(desired.weights.get(cid, ()))
    split = desired.split.get(cid, 0.0)
    plan_changed = was != now or (
        weights,
        split,
    ) != (tuple(commanded.weights.get(cid, ())), commanded.split.get(cid, 0.0))
    if returning:
        return Intent(
            IntentKind.FAILBACK,
            cid,
            _sorted(members, index, k),
            now,
            returning=tuple(sorted(returning)),
        )
    if plan_changed and weights:
        return Intent(
            IntentKind.BALANCE,
            cid,
            _sorted(members, index, k),
            now,
            weights=weights,
            split_ratio=split,
        )
    if plan_changed:
        return Intent(IntentKind.REBALANCE, cid, _sorted(members, index, k), now)
    return None


def _transit_changes(
    commanded: Desired, desired: Desired, cid: int, members: Set[int]
) -> list[Intent]:
    """NVL_TRANSIT to the members given a transit GPU they were not told."""
    transit = dict(desired.transit.get(cid, {}))
    told = dict(commanded.transit.get(cid, {}))
    changed = {r: g for r, g in transit.items() if r in members and told.get(r) != g}
    if not changed:
        return []
    return [
        Intent(
            IntentKind.NVL_TRANSIT,
            cid,
            tuple(sorted(changed)),
            transit=tuple(sorted(changed.items())),
        )
    ]


def _sorted(members: Set[int], index: JobIndex | None, k: int) -> tuple[int, ...]:
    return tuple(sorted(members)) if index is None else index.comms[k].told_sorted


def transit_refused(commanded: Desired, comm_id: int, ranks: Iterable[int]) -> Desired:
    """What the ranks were told, less the transit GPUs these ranks of `comm_id` refused."""
    gone = set(ranks)
    told = {r: g for r, g in commanded.transit.get(comm_id, {}).items() if r not in gone}
    transit = {c: t for c, t in commanded.transit.items() if c != comm_id}
    if told:
        transit[comm_id] = told
    return replace(commanded, transit=transit)


def failback_refused(
    commanded: Desired, held: Desired, comm_id: int, ranks: Iterable[int]
) -> Desired:
    """What the ranks were told, once a fail-back of `comm_id` returning `ranks` was refused:
    those ranks on the backup `held` keeps them on, and the communicator's channel plan
    as `held` has it (what they still run, the refused switch point never applied)."""
    moved = dict(commanded.moved)
    moved.update({r: held.moved[r] for r in ranks if r in held.moved})

    def one(told: Mapping[int, Any], wanted: Mapping[int, Any]) -> dict[int, Any]:
        out = {c: v for c, v in told.items() if c != comm_id}
        if comm_id in wanted:
            out[comm_id] = wanted[comm_id]
        return out

    return replace(
        commanded,
        mode=held.mode,
        moved=moved,
        disabled=one(commanded.disabled, held.disabled),
        mitigation=one(commanded.mitigation, held.mitigation),
        weights=one(commanded.weights, held.weights),
        split=one(commanded.split, held.split),
        transit=one(commanded.transit, held.transit),
    )

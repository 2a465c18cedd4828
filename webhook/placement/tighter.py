"""Holding out for a tighter domain: a job that fits now, but only across a slower level than one
domain could hold it within, waits for room there instead while the wait is worth the stretch it
saves, and no longer than the stretch allows (`tight_wait_weight`, `tight_wait_seconds`,
`tight_wait_cap`; docs/concepts.md#waiting). Pure: it reads the tree, changes nothing."""
from __future__ import annotations

import dataclasses

from ..core.model import Decision, Hold, PlacementRequest, Strategy
from ..state.tree import TopologyTree
from . import estimate, waiting, walk
from .enforce import how_held
from .walk import Member


def held_for_tighter(subset: TopologyTree, request: PlacementRequest, chain: list[Member], placed: Decision,
                     narrowest: int) -> Decision:
    """`placed`, or a wait for a domain narrower than its scope where `placed` spans a slower level
    than the tightest one that could hold the request: while the wait expected there, in run times,
    is under `tight_wait_weight` times the stretch that saves (both as `_worth_spilling` counts
    them), and the request has waited less than `tight_wait_seconds` per run time of that stretch
    (unless the stretch is above `tight_wait_cap`). Only for waits the gate holds and decides again
    (`gate_waits`, `PlacementRequest.may_pin_wait`): a pin would never age. `placed` gains a reason
    when it starts because the wait aged out."""
    config = subset.config
    if (not config.tight_wait_weight or not config.gate_waits or request.pods == 1 or placed.scope is None
            or request.strategy not in (Strategy.CONSOLIDATED, Strategy.BALANCED)):
        return placed
    level, tightest = placed.scope.level, tightest_level(subset, request)
    if level >= tightest:
        return placed
    wait = waiting.wait_decision(subset, request, chain, max(narrowest, level + 1))
    member = walk.lookup(subset, wait.scope.path) if wait.scope is not None and wait.scope.path else None
    if member is None or how_held(wait, config) is not Hold.GATE:
        return placed
    stretch = _stretch(subset, request, (level, tightest), member)
    expected = waiting.expected_wait(member, request.gpus_per_pod, request.pods)
    if stretch <= 0 or not expected < config.tight_wait_weight * stretch:
        return placed
    allowed = config.tight_wait_seconds * stretch
    if config.tight_wait_seconds and request.waited_seconds >= allowed and not (
            config.tight_wait_cap and stretch > config.tight_wait_cap):
        return dataclasses.replace(placed, reasons=(*placed.reasons, (
            f"it waited {request.waited_seconds:.0f} s for {member.label}, past the {allowed:.0f} s "
            f"that a stretch of {stretch:.2f} run times allows (tight_wait_seconds): it starts now")))
    bound = ("with no bound: a stretch above tight_wait_cap never ages"
             if not config.tight_wait_seconds or (config.tight_wait_cap and stretch > config.tight_wait_cap)
             else f"up to {allowed:.0f} s ({request.waited_seconds:.0f} s so far)")
    why = (f"it fits now in {placed.scope}, which would stretch its run by {stretch:.2f} run times over "
           f"{member.label}, where room is expected in {expected:.2f} run times (under "
           f"{config.tight_wait_weight:g} x the stretch): it waits there, {bound}")
    return dataclasses.replace(wait, reasons=(why, *wait.reasons[1:]))


def tightest_level(subset: TopologyTree, request: PlacementRequest) -> int:
    """The widest level the request may span at the bandwidth of the narrowest level one domain of
    which could hold it on an idle cluster (-1: the cluster): no placement is faster than that."""
    gpus, pods = request.gpus_per_pod, request.pods
    if subset.root.fits_idle(gpus * pods):  # one node holds it all
        level = len(subset.levels)
    else:
        level = next((lv for lv in range(len(subset.levels) - 1, -1, -1)
                      if any(d.fits_idle(gpus) >= pods for d in subset.levels[lv].values())), -1)
    while level >= 0 and not estimate.spill_costs(subset, request, level):
        level -= 1
    return level


def _stretch(subset: TopologyTree, request: PlacementRequest, levels: tuple[int, int], member: Member) -> float:
    """How much longer, in run times, the request runs spanning a domain of the first of `levels`
    than within `member`: `communication_share` times the bandwidth lost, relative to that across
    the second (the tightest level)."""
    level, tightest = levels
    node = waiting.first_node(member)
    tight = estimate.bandwidth_across(subset, request, tightest, node)
    return subset.config.communication_share * tight * (
        1 / estimate.bandwidth_across(subset, request, level, node)
        - 1 / estimate.bandwidth_across(subset, request, member.ref.level, node))

"""Decisions against the shared index: lock, expire, decide (kept off what older waits need where
it can be), reserve, in that order.

The placement core decides and writes nothing; this is where a decision meets the state that
other requests and the watch threads change, so it holds the index's lock across a decision and
its hold. Other callers ask the index's queries, which take the lock themselves (state/queries.py).

With replicas sharing claims (`index.shared_claims`, webhook/kube/shared_claims.py over the API), a placed decision
is also written there, against the version of the claims it was made with: when another replica
wrote first, decide again. Past the claims' time budget the decision stands alone, and says so.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import zlib
from typing import Callable

from ..core.model import GROUP_MISMATCH, NO_ROOM_NOW, Decision, DomainRef, Outcome, PlacementRequest, on_nodes
from ..core.strategies import Layout
from ..state.gated import GatedGroup
from ..state.index import ClusterIndex
from ..state.tree import TopologyTree
from . import protection
from .decide import decide
from .walk import Member

CONFLICT = "conflict"  # a claim's answer when another replica wrote first
# One group's members decide one at a time (the first decides, the others join), without holding
# the index lock across the claims' API writes; groups hashed apart do not wait on each other.
_GROUP_LOCKS = tuple(threading.Lock() for _ in range(64))


def place(index: ClusterIndex, request: PlacementRequest, key: str | None = None) -> Decision:
    """Decide without holding anything (dry runs, explanations, benchmarks). `key`: the workload's
    reservation key, when it has one, so that its own pinned wait is not protected against it."""
    with index.lock:
        return _decide(index, request, key)


def place_gated(index: ClusterIndex, request: PlacementRequest, waiting: DomainRef, key: str | None) -> Decision | None:
    """A wait held back by its scheduling gate, decided again (at a release, oldest first): placed
    in the domain it waits in when that holds it now (as its preferred domain), else wherever the
    core places it now if that is no wider than the domain waited in; None while neither holds it.
    Nothing is held.

    Why no wider: the wait was weighed at that level (`pin_only_where_locality_pays`), so room that
    opens in an equal domain is as good and starts it now, which a pin could not; a wider span would
    run slower than the wait was judged worth. With `tight_wait_weight` the core weighs that again
    (tighter.py), with how long the workload has waited: wider, once the wait is no longer worth it."""
    with index.lock:
        if key is not None:
            request = dataclasses.replace(request, waited_seconds=index.waited_seconds(key))
        # With tight_wait_weight the core may start it wider (`held_for_tighter` weighed the wait
        # and aged it): then only a cluster with no room at all spares deciding.
        wider = bool(index.config.tight_wait_weight)
        if not _holds_no_wider(index.restricted_to(request), request, -1 if wider else waiting.level):
            return None  # the common answer while it waits, without deciding (and explaining) a wait
    label, value = waiting.path[-1] if waiting.path else ("", "")
    decision = place(index, dataclasses.replace(request, preferred_domain=f"{label}={value}"), key) if value else None
    if decision is not None and decision.outcome is not Outcome.PLACED and not wider:
        return None  # no room anywhere (with the rule, a wait for a tighter domain: decided without the preference)
    if decision is None or decision.outcome is not Outcome.PLACED or decision.scope is None \
            or decision.scope.path[:len(waiting.path)] != waiting.path:
        decision = place(index, request, key)
    if decision.outcome is not Outcome.PLACED or decision.scope is None or (
            decision.scope.level < waiting.level and not wider):
        return None
    span = "no wider" if decision.scope.level >= waiting.level else "wider, as the reasons above say"
    return dataclasses.replace(decision, reasons=(
        *decision.reasons, f"it waited for {waiting} behind its scheduling gate and starts in {decision.scope}, "
        + span))


def _holds_no_wider(subset: TopologyTree, request: PlacementRequest, level: int) -> bool:
    """Whether some domain of `level` (a node, at the node level) or narrower holds every pod of
    the request whole now: what any placement no wider than a wait at `level` needs. Walks down
    only through domains that hold them, as every domain around one that does holds them too."""
    pods, gpus = request.pods, request.gpus_per_pod
    frontier: list[Member] = [subset.root]
    while frontier:
        member = frontier.pop()
        if member.fits_now(gpus) >= pods:
            if member.ref.level >= level:
                return True
            frontier.extend(member.children.values())
    return False


def _decide(index: ClusterIndex, request: PlacementRequest, key: str | None) -> Decision:
    """The core's decision, kept off the GPUs that older pinned waits need where it can be
    (protection.py): decided again with them held when the first answer takes them."""
    decision = decide(index.whole_tree(), request, index.restricted_to(request), index.pools)
    seconds = index.config.protect_waiting_seconds
    if not seconds or not index.pinned_waits() or decision.outcome is not Outcome.PLACED:
        return decision
    needed = protection.needs(index.pinned_waits(), index.now(), seconds, key)
    if not protection.reaches(index.whole_tree(), needed, decision):
        return decision
    shield = protection.protected(index.whole_tree(), needed)
    if not shield.taken_by(decision):
        return decision
    index.reserve(protection.PROTECTION_KEY, shield.gpu_sets(index.whole_tree()))
    try:
        second = decide(index.whole_tree(), request, index.restricted_to(request), index.pools)
    finally:
        index.release(protection.PROTECTION_KEY)
    return protection.chosen(decision, second, shield)


def place_and_reserve(index: ClusterIndex, request: PlacementRequest, key: str | None,
                      stamp: str | None = None) -> Decision:
    """Decide and hold the chosen GPUs under `key`, atomically; for the admission `stamp`, held
    provisionally until the apiserver is seen to store it (state/holds.py). The workload's own
    earlier hold (that admission's, with a stamp) is dropped first, so placing it again
    (reinvocation, retries) never counts it twice; without a key (dry runs) nothing is held."""
    if key is None:
        with index.lock:
            index.expire_reservations()
            return _decide(index, request, None)
    decision = _held(index, key, lambda: _decide(index, request, key), stamp)
    assert decision is not None  # _decide always decides
    return decision


def _held(index: ClusterIndex, key: str, decide: Callable[[], Decision | None], stamp: str | None = None
          ) -> Decision | None:
    """`decide()` with the index locked and `key`'s own hold dropped, and a placement held under it."""
    with index.lock:
        index.expire_reservations()
        index.release(key, stamp)
        decision = decide()
        if decision is not None and decision.outcome is Outcome.PLACED:
            sets: dict[str, list[tuple[int, ...]]] = {}
            for assigned in decision.assignment:
                sets.setdefault(assigned.node, []).extend(assigned.gpu_ids)
            index.reserve(key, sets, stamp=stamp)
        return decision


def place_shared(index: ClusterIndex, request: PlacementRequest, key: str | None, group: bool = False,
                 stamp: str | None = None) -> tuple[Decision, list[str]]:
    """`place_and_reserve`, and the hold claimed for every replica when they share claims: at
    most one write when nobody else wrote meanwhile, a new decision for every 409; none before the
    answer for a placement inside this replica's allotment, unless it is a `group`'s (its other
    members, on any replica, join what the Lease says). Returns the decision and the warnings to
    give (a decision made alone)."""
    claims = index.shared_claims
    if claims is None or key is None:
        return place_and_reserve(index, request, key, stamp), []

    spreading = (request.strategy.rules.layout is Layout.SPREAD and not request.latency_sensitive
                 and not request.preferred_domain)  # round-robin over the leaves with room

    def decide() -> Decision:  # under the lock: the allotment as it is now, after a 409 too
        allotted = None if group else claims.allotted(spreading)
        if allotted is None:
            return place_and_reserve(index, request, key, stamp)
        if allotted.spread and spreading:
            spread = place_and_reserve(index, on_nodes(request, list(allotted.spread)), key, stamp)
            if spread.outcome is Outcome.PLACED and _apart(index, spread, request.pods):
                return dataclasses.replace(spread, request=request)
        return place_and_reserve(index, dataclasses.replace(request, search_first=allotted.domain), key, stamp)
    decision, alone = _shared(index, key, request.workload, decide, may_spend=not group)
    assert decision is not None
    return decision, alone


def _apart(index: ClusterIndex, spread: Decision, pods: int) -> bool:
    """Whether a spread decided on an allotment's nodes for spreads is as far apart as one decided
    on every node would start: each pod on a node and a leaf of its own."""
    leaves = {index.nodes[assigned.node].parent for assigned in spread.assignment}
    return len(spread.assignment) == len(leaves) == pods


def start_gated(index: ClusterIndex, group: GatedGroup) -> tuple[Decision | None, list[str]]:
    """`place_gated` for a workload our gate holds, held under its key and claimed for every
    replica as `place_shared` does: what the releaser starts it with. (None, []) while it waits,
    and when a hold under its key is another's: another replica claimed its release first (the
    claims brought it, or the read after a lost compare-and-swap did), and it is not decided twice."""
    levels = index.config.levels
    depth = len(group.path) - 1  # a path names every level from the widest down to its own
    waiting = DomainRef(depth, levels[depth].name if depth < len(levels) else "node", group.path)
    key = group.hold
    ours: list[object] = [None]  # the hold this call made, if any: deciding again after a 409 replaces it

    def decide() -> Decision | None:
        held = index.hold(key)
        if held is not None and held is not ours[0]:
            return None
        decision = _held(index, key, lambda: place_gated(index, group.request, waiting, group.reservation))
        ours[0] = index.hold(key)
        return decision
    return _shared(index, key, group.request.workload, decide)


def _shared(index: ClusterIndex, key: str, who: str, decide: Callable[[], Decision | None], may_spend: bool = False
            ) -> tuple[Decision | None, list[str]]:
    """Decide and claim the placement for every replica (when they share claims), deciding again
    after each 409 within the claims' time budget; a placement claimed by nobody comes back with
    the warning that it was made alone. `may_spend`: a placement inside this replica's allotment
    is claimed after the answer (not for a release by the gate, which the claim is what keeps
    from being started twice, nor for a group's, which the others join through it), and a wait
    decided while other replicas' allotments hold GPUs is decided again once they gave them back."""
    claims = index.shared_claims
    if claims is None:
        return decide(), []
    deadline = time.monotonic() + claims.budget_seconds
    while True:
        with index.lock:
            decision = decide()
            basis = claims.basis()
            if may_spend and decision is not None and decision.outcome is Outcome.PLACED and claims.spend(key):
                return decision, []  # inside this replica's allotment: written after the answer
        # asked within half the budget: the claim after it keeps the other half
        if decision is not None and decision.code == NO_ROOM_NOW and may_spend \
                and claims.ask_back(deadline - claims.budget_seconds / 2, decision.request):
            continue  # the room it waits for may have been another replica's allotment: decide again
        if decision is None or decision.outcome is not Outcome.PLACED:
            return decision, []
        problem = claims.claim(key, basis, deadline)
        if problem is None:
            return decision, []
        if problem != CONFLICT or time.monotonic() >= deadline:
            return decision, [claims.alone(who, problem)]


def place_group(index: ClusterIndex, request: PlacementRequest, key: str, reserve: bool, stamp: str | None = None
                ) -> tuple[Decision, list[str], bool]:
    """The decision of the group `key`: the one its first member got, or, for the first member, a
    new one for the whole group, held under the group's key (`reserve`) and remembered for the
    members to come. A dry run joins a group but starts none. Returns (decision, warnings, joined)."""
    with _GROUP_LOCKS[zlib.crc32(key.encode()) % len(_GROUP_LOCKS)]:
        with index.lock:
            decision = index.group(key)
            claimed = index.hold(key) if decision is None else None
            nodes = sorted(claimed.sets) if claimed is not None else []
        if decision is not None:
            first = decision.request
            if (first.pods, first.gpus_per_pod) != (request.pods, request.gpus_per_pod):
                return _mismatch(request, f"{first.pods} pod(s) x {first.gpus_per_pod} GPU(s)"), [], True
            return decision, [], True
        if claimed is not None and request.pods < claimed.pods:
            # The hold under this key (another replica's claim, or the workload's own) is never
            # shrunk by a member that says the group is smaller: labels and owners are the pod's
            # to write. (Bound members make a claim read smaller, never larger.)
            return _mismatch(request, f"{claimed.pods} pod(s)"), [], True
        if nodes:  # another replica placed the group first and claimed it: decide on its nodes
            request = on_nodes(request, nodes)
        decision, alone = place_shared(index, request, key if reserve else None, group=True, stamp=stamp)
        if reserve and decision.outcome is not Outcome.NEVER:  # a denial is the member's alone
            with index.lock:
                index.remember_group(key, decision)
        return decision, alone, False


def _mismatch(request: PlacementRequest, placed_for: str) -> Decision:
    return Decision(Outcome.NEVER, request, None, code=GROUP_MISMATCH, reasons=(
        f"{request.workload}: this member declares {request.pods} pod(s) x {request.gpus_per_pod} GPU(s), but the "
        f"group was placed for {placed_for} when its first member arrived; allowed: the same size on every member",))


def group_decision(index: ClusterIndex, key: str) -> Decision | None:
    """The decision of the group `key` if one of its members was placed, else None."""
    with index.lock:
        return index.group(key)


def release_shared(index: ClusterIndex, key: str) -> None:
    """A workload is deleted: drop its hold here, and its claim for every replica."""
    index.release(key)
    claims = index.shared_claims
    if claims is not None:
        problem = claims.unclaim(key, time.monotonic() + claims.budget_seconds)
        if problem is not None:
            claims.alone(f"the release of {key}", problem)

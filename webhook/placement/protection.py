"""Protect the waiting: new work that has an equally tight place elsewhere stays off the GPUs that
a pinned wait needs in its domain.

A consolidated workload that found no room waits pinned to the domain that will fit it first (its
pods carry `waiting-for`, injection.py). Under load that domain keeps refilling: small jobs are
best-fitted into the GPUs freed there, and the large job waits longer than it must. So, for
`protect_waiting_seconds` from when the index first saw each waiting pod, the free GPUs of its
domain are set aside for it, oldest waiter first, at most its own need, on the nodes closest to
holding a pod; the placer (placer.py) decides a new request once as usual and, if that takes
protected GPUs, again with them held, and keeps the second answer only when it is a placement at
least as tight (the same level or deeper) and honours the preferred domain whenever the first did.
So protection never turns a placement into a wait and never crosses max-domain or the request's
own constraints (the second decision is made for the same request). Waits are left as they are:
sending a new wait away from a domain an older one waits in was tried and cost the largest jobs
more than it saved (bench/README.md).

Pure: it reads the tree and the waiters and returns GPU sets; the placer holds them.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from dataclasses import dataclass
from typing import Mapping

from ..core.model import Decision, Outcome
from ..state.tree import Domain, TopologyTree
from ..state.waits import Waiting
from . import walk
from .walk import Member

# The ledger key the protected sets are held under, only while the placer decides again. No
# workload has it: a reservation key is namespace/Kind/name and a namespace has no spaces.
PROTECTION_KEY = "(protected for waiting workloads)"


@dataclass(frozen=True)
class Protected:
    """GPU counts set aside per node (one per waiter served there), the free GPUs left beside them
    there, and the domains of the waiters they are for, oldest first."""

    takes: Mapping[str, list[int]]
    room: Mapping[str, int]
    domains: tuple[str, ...]

    def taken_by(self, decision: Decision) -> bool:
        """Whether a placement takes more GPUs on some node than are free there beside those set
        aside (which GPUs it takes is the device plugin's to choose: only counts matter)."""
        gpus = decision.request.gpus_per_pod
        return decision.outcome is Outcome.PLACED and any(
            a.node in self.room and a.pods * gpus > self.room[a.node] for a in decision.assignment)

    def gpu_sets(self, tree: TopologyTree) -> dict[str, list[tuple[int, ...]]]:
        """Free GPU indices for each count, to hold while deciding again: worked out only then,
        since most decisions take nothing set aside."""
        sets: dict[str, list[tuple[int, ...]]] = {}
        for name, counts in self.takes.items():
            node = tree.nodes[name]
            taken = node.taken_ids
            free = [i for i in range(node.gpus) if i not in taken]
            ends = list(itertools.accumulate(counts))
            sets[name] = [tuple(free[end - count:end]) for count, end in zip(counts, ends)]
        return sets


def needs(waiting: Waiting, now: float, seconds: float, exclude: str | None) -> list[tuple[tuple, int]]:
    """(domain path, GPUs) per waiting workload and domain, counting its pods still inside their
    time (`seconds` since each was first seen waiting), oldest first by its earliest such pod, never
    the workload `exclude` itself."""
    found: list[tuple[float, tuple[str, tuple], int]] = []
    for (key, path), group in waiting.groups.items():
        if key == exclude or now - group.last > seconds:
            continue  # every pod past its time
        if now - group.first <= seconds:
            found.append((group.first, (key, path), group.gpus))
        else:
            inside = [waiter for waiter in group.pods.values() if now - waiter.since <= seconds]
            found.append((min(w.since for w in inside), (key, path), sum(w.gpus for w in inside)))
    return [(path, gpus) for _, (_, path), gpus in sorted(found)]


def reaches(tree: TopologyTree, needed: list[tuple[tuple, int]], decision: Decision) -> bool:
    """Whether a placement uses a node in some domain a waiter needs: only then can it take GPUs
    set aside, so only then are they worked out. (Under overload, with waits pinned in zones and
    spines, nearly every placement does; the saving is at lighter load.)"""
    paths = {path for path, _ in needed}
    for assigned in decision.assignment:
        path = tree.nodes[assigned.node].path
        if any(path[:depth] in paths for depth in range(len(path) + 1)):
            return True
    return False


def protected(tree: TopologyTree, needed: list[tuple[tuple, int]]) -> Protected:
    """The GPUs to keep new work off: for each of `needed` (`needs`) in turn, the free GPUs of its
    domain up to its need, from the nodes with the most free first (ties in the tree's order: by
    domain path, then node name)."""
    takes: dict[str, list[int]] = {}
    left: dict[str, int] = {}  # node -> free GPUs not yet set aside
    # Domain path -> a best-first search of its subtree: a heap of (-most free GPUs, path, member).
    # A domain's entry bounds every node below it (its free capacity index gives the most free on
    # any one node) and sorts before them on a tie, so it is opened before any of them could be
    # due: a waiter opens only the domains holding the few nodes it takes, while a sort of every
    # node in a zone per decision was most of a protected decision's time. An entry that an
    # overlapping waiter's take made stale is put back in its place when popped. Many waiters
    # share a zone's or spine's search.
    searches: dict[tuple, list[tuple[int, tuple, Member]]] = {}
    domains = []
    for path, need in needed:
        member = walk.lookup(tree, path)
        if member is None:
            continue  # its domain is gone: nothing to keep
        search = searches.get(path)
        if search is None:
            search = searches[path] = []
            _push(search, member, left)
        first = True
        while need > 0 and search:
            key, _, popped = heapq.heappop(search)
            if popped.children:
                for child in popped.children.values():
                    _push(search, child, left)
                continue
            node = walk.as_node(popped)
            room = left.get(node.name, node.free)
            if room != -key:
                _push(search, node, left)
                continue
            if first:
                domains.append(member.label)
                first = False
            take = min(room, need)
            takes.setdefault(node.name, []).append(take)
            left[node.name], need = room - take, need - take
            _push(search, node, left)
    return Protected(takes, {name: left[name] for name in takes}, tuple(domains))


def _push(search: list[tuple[int, tuple, Member]], member: Member, left: Mapping[str, int]) -> None:
    """Add a member with GPUs not yet set aside below it to a search; a full one is never due."""
    if isinstance(member, Domain):
        most = member.most_free
    else:
        most = left.get(member.name, member.free)
    if most > 0:
        heapq.heappush(search, (-most, member.path, member))


def chosen(first: Decision, second: Decision, shield: Protected) -> Decision:
    """The placement to give: `second` (made with the protected GPUs held) when it is a placement
    as tight as `first` that honours the preferred domain whenever `first` did, else `first`; with
    a reason either way."""
    assert first.scope is not None
    where = ", ".join(dict.fromkeys(shield.domains))
    if (second.outcome is Outcome.PLACED and second.scope is not None and second.scope.level >= first.scope.level
            and (first.preferred_honoured is not True or second.preferred_honoured is True)):
        return dataclasses.replace(second, reasons=second.reasons + (
            f"kept off GPUs set aside for older waiting workloads in {where}: as tight a place had room",))
    return dataclasses.replace(first, reasons=first.reasons + (
        f"takes GPUs set aside for older waiting workloads in {where}: no place as tight had room elsewhere",))

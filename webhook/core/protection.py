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
from dataclasses import dataclass
from typing import Iterable, Mapping

from . import walk
from .model import Decision, Outcome
from .topology import NodeState, TopologyTree

# The ledger key the protected sets are held under, only while the placer decides again. No
# workload has it: a reservation key is namespace/Kind/name and a namespace has no spaces.
PROTECTION_KEY = "(protected for waiting workloads)"


@dataclass(frozen=True)
class Waiter:
    """One pending pod of a pinned wait."""

    key: str  # the reservation key of its workload (its own requests are never kept off its GPUs)
    path: tuple[tuple[str, str], ...]  # the domain it waits in
    gpus: int
    since: float  # when the index first saw it waiting, by the index's clock


@dataclass(frozen=True)
class Protected:
    """GPU sets set aside per node, the free GPUs left beside them there, and the domains of the
    waiters they are for, oldest first."""

    sets: Mapping[str, list[tuple[int, ...]]]
    room: Mapping[str, int]
    domains: tuple[str, ...]

    def taken_by(self, decision: Decision) -> bool:
        """Whether a placement takes more GPUs on some node than are free there beside those set
        aside (which GPUs it takes is the device plugin's to choose: only counts matter)."""
        gpus = decision.request.gpus_per_pod
        return decision.outcome is Outcome.PLACED and any(
            a.node in self.room and a.pods * gpus > self.room[a.node] for a in decision.assignment)


def needs(waiters: Iterable[Waiter], now: float, seconds: float, exclude: str | None) -> list[tuple[tuple, int]]:
    """(domain path, GPUs) per waiting workload and domain still inside its time (`seconds` since
    its first pod was seen waiting), oldest first, never the workload `exclude` itself."""
    found: dict[tuple[str, tuple], list[float]] = {}  # (key, path) -> [since, GPUs]
    for waiter in waiters:
        if waiter.key == exclude or now - waiter.since > seconds:
            continue
        entry = found.setdefault((waiter.key, waiter.path), [waiter.since, 0])
        entry[0] = min(entry[0], waiter.since)
        entry[1] += waiter.gpus
    return [(path, int(gpus)) for (_, path), (_, gpus) in sorted(found.items(), key=lambda item: (item[1][0], item[0]))]


def reaches(tree: TopologyTree, needed: list[tuple[tuple, int]], decision: Decision) -> bool:
    """Whether a placement uses a node in some domain a waiter needs: only then can it take GPUs
    set aside, so only then are they worked out (most placements under load are elsewhere)."""
    paths = {path for path, _ in needed}
    for assigned in decision.assignment:
        path = tree.nodes[assigned.node].path
        if any(path[:depth] in paths for depth in range(len(path) + 1)):
            return True
    return False


def protected(tree: TopologyTree, needed: list[tuple[tuple, int]]) -> Protected:
    """The GPUs to keep new work off: for each of `needed` (`needs`) in turn, the free GPUs of its
    domain up to its need, from the nodes with the most free first."""
    sets: dict[str, list[tuple[int, ...]]] = {}
    left: dict[str, int] = {}  # node -> free GPUs not yet set aside
    domains = []
    for path, need in needed:
        member = walk.lookup(tree, path)
        if member is None:
            continue  # its domain is gone: nothing to keep
        nodes = sorted((n for n in walk.nodes_fitting(member, 1) if left.get(n.name, n.free) > 0),
                       key=lambda n: (-left.get(n.name, n.free), n.name))
        if nodes and need > 0:
            domains.append(member.label)
        for node in nodes:
            if need <= 0:
                break
            take = min(left.get(node.name, node.free), need)
            sets.setdefault(node.name, []).append(_free_ids(node, sets.get(node.name, ()), take))
            left[node.name] = left.get(node.name, node.free) - take
            need -= take
    return Protected(sets, {name: left[name] for name in sets}, tuple(domains))


def _free_ids(node: NodeState, already: Iterable[tuple[int, ...]], count: int) -> tuple[int, ...]:
    taken = node.taken_ids.union(*already)
    return tuple(i for i in range(node.alloc) if i not in taken)[:count]


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

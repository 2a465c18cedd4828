"""Decisions against the shared index: lock, expire, decide, reserve, in that order.

The placement core decides and writes nothing; this is where a decision meets the state that
other requests and the watch threads change, so it is the one place that takes the index's lock.
"""
from __future__ import annotations

from .cluster import ClusterIndex
from .model import Decision, Outcome, PlacementRequest, Strategy
from .placement import decide
from .topology import TopologyTree


def place(index: ClusterIndex, request: PlacementRequest) -> Decision:
    """Decide without holding anything (dry runs, explanations, benchmarks)."""
    with index.lock:
        return decide(index.tree, request, _prepared(index, request))


def _prepared(index: ClusterIndex, request: PlacementRequest) -> TopologyTree:
    """The part of the index the request may use, with its best-fit orders current."""
    subset = index.restricted_to(request)
    subset.catch_up(request.gpus_per_pod, spread=request.strategy is Strategy.DISTRIBUTED)
    return subset


def place_and_reserve(index: ClusterIndex, request: PlacementRequest, key: str | None) -> Decision:
    """Decide and hold the chosen GPUs under `key`, atomically. The workload's own earlier hold is
    dropped first, so placing it again (reinvocation, retries) never counts it twice; without a
    key (dry runs) nothing is held."""
    with index.lock:
        index.expire_reservations()
        if key is None:
            return decide(index.tree, request, _prepared(index, request))
        index.release(key)
        decision = decide(index.tree, request, _prepared(index, request))
        if decision.outcome is Outcome.PLACED:
            sets: dict[str, list[tuple[int, ...]]] = {}
            for assigned in decision.assignment:
                sets.setdefault(assigned.node, []).extend(assigned.gpu_ids)
            index.reserve(key, sets)
        return decision

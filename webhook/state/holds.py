"""The reservation ledger: GPU sets held for workloads that are admitted but not yet bound.

A hold is made when a workload is placed and lasts until its pods are seen bound (each bound pod
confirms one held set), the workload is deleted, or its time runs out. The ledger is the only
owner of holds, of the clock they expire by, and of the rule that says which objects may touch
a hold (keys are `namespace/Kind/name`; only objects of that namespace confirm or release it).

Holds come from two sources. A workload hold is made when a workload is placed (here, or by
another replica through a shared claim). A pod hold is read from a pod the watch sees that carries
our placement and is not bound yet (its reservation key, the GPU set we chose and the one node it
is pinned to): every replica sees the same pods, so pod holds survive restarts and agree across
replicas without any write. A pod hold counts only while its key has no workload hold: a Job's
pods appearing replace the Job's hold, never add to it.

Group decisions live here too: the pods of one group (webhook/objects/groups.py) arrive one at a time,
and every one after the first joins the decision the first one made, kept under the group's key
until no member has joined for a hold's lifetime.

It knows nothing of nodes beyond their names: every change returns the names of the nodes whose
held GPUs changed, and the cluster index recounts those.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

GpuSet = tuple[int, ...]


def reservation_key(namespace: str, kind: str, name: str) -> str:
    """The key a placed workload's hold is kept under, and written on its pods: namespace/Kind/name."""
    return f"{namespace}/{kind}/{name}"


def held_by(key: str, namespace: str, kind: str) -> bool:
    """Whether a reservation key belongs to an object of this kind in this namespace itself (a
    Job's pods carry the Job's key, which a pod's deletion must not release)."""
    return key.startswith(reservation_key(namespace, kind, ""))


def in_namespace(key: str, namespace: str) -> bool:
    """Whether a key names a hold of `namespace`: nothing outside it may confirm or release it."""
    return key.startswith(f"{namespace}/")


@dataclass
class Reservation:
    key: str
    sets: dict[str, list[GpuSet]]  # node name -> GPU sets still held there, one per unbound pod
    expires_at: float
    confirmed: set[str] = field(default_factory=set)  # pod keys already counted

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.sets)

    @property
    def pods(self) -> int:
        """Pods the hold was made for: one set per pod still unbound, plus those bound since."""
        return sum(len(sets) for sets in self.sets.values()) + len(self.confirmed)


class ReservationLedger:
    """Holds by key, and by node for the index's recounts. Not thread safe on its own: the
    cluster index calls it under its lock."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.holds: dict[str, Reservation] = {}
        self._on_node: dict[str, dict[str, list[GpuSet]]] = {}  # node -> key -> sets (the same lists)
        # (expires_at, key) of every hold made, soonest first: expiry runs before every decision
        # and must not scan all holds. An entry whose hold was since released or renewed is skipped.
        self._expiry: list[tuple[float, str]] = []
        self.pod_holds: dict[str, tuple[str, str, GpuSet]] = {}  # pod key -> (reservation key, node, set)
        self._pods_on_node: dict[str, dict[str, tuple[str, GpuSet]]] = {}  # node -> pod key -> (key, set)
        self._pods_of: dict[str, set[str]] = {}  # reservation key -> pod keys holding under it
        self.groups: dict[str, tuple[Any, float]] = {}  # group key -> (its decision, expires_at)
        self._group_expiry: list[tuple[float, str]] = []

    def hold(self, key: str) -> Reservation | None:
        return self.holds.get(key)

    def group(self, key: str) -> Any:
        """The decision a group's first member got, or None; each member that joins renews it."""
        entry = self.groups.get(key)
        if entry is None or entry[1] <= self.clock():
            return None
        self.remember_group(key, entry[0])
        return entry[0]

    def remember_group(self, key: str, decision: Any) -> None:
        now = self.clock()
        while self._group_expiry and self._group_expiry[0][0] <= now:  # forget groups nobody joined lately
            expires_at, old = heapq.heappop(self._group_expiry)
            if old in self.groups and self.groups[old][1] == expires_at:
                del self.groups[old]
        expires_at = now + self.ttl_seconds
        self.groups[key] = (decision, expires_at)
        heapq.heappush(self._group_expiry, (expires_at, key))

    def held_on(self, node: str) -> Iterable[GpuSet]:
        """Every GPU set held on a node, whoever holds it; a pod's only while its workload holds none."""
        for sets in self._on_node.get(node, {}).values():
            yield from sets
        for key, held in self._pods_on_node.get(node, {}).values():
            if key not in self.holds:
                yield held

    def hold_pod(self, pod: str, key: str, namespace: str, node: str, held: GpuSet) -> set[str]:
        """An unbound pod of `namespace` carrying `key`, pinned to `node` with GPU set `held`.
        Returns the nodes whose holds changed."""
        if not in_namespace(key, namespace) or self.pod_holds.get(pod) == (key, node, held):
            return set()
        changed = self.drop_pod(pod)
        self.pod_holds[pod] = (key, node, held)
        self._pods_on_node.setdefault(node, {})[pod] = (key, held)
        self._pods_of.setdefault(key, set()).add(pod)
        return changed | {node}

    def drop_pod(self, pod: str) -> set[str]:
        """The pod is bound, finished or gone: it holds nothing any more."""
        entry = self.pod_holds.pop(pod, None)
        if entry is None:
            return set()
        key, node, _ = entry
        by_pod = self._pods_on_node[node]
        del by_pod[pod]
        if not by_pod:
            del self._pods_on_node[node]
        pods = self._pods_of[key]
        pods.discard(pod)
        if not pods:
            del self._pods_of[key]
        return {node}

    def _pod_nodes_of(self, key: str) -> set[str]:
        """Nodes of the pod holds under `key`: they count or not as the key's workload hold goes."""
        return {self.pod_holds[pod][1] for pod in self._pods_of.get(key, ())}

    def reserve(self, key: str, sets_per_node: Mapping[str, Iterable[GpuSet]], ttl: float | None = None) -> set[str]:
        """Hold GPU sets for `key` until now + TTL (`ttl`, for a claim made elsewhere: what is left
        of it). Reserving a key again replaces its old hold, so placing a workload again never
        books it twice. Returns the nodes whose holds changed: where a hold is replaced, only the
        nodes whose sets differ (another replica's allotment changes a few nodes of a hundred)."""
        before = self.holds.get(key)
        changed = self.release(key)
        sets = {node: list(held) for node, held in sets_per_node.items() if held}
        if not sets:
            return changed
        reservation = Reservation(key, sets, self.clock() + (self.ttl_seconds if ttl is None else ttl))
        self.holds[key] = reservation
        for node, held in sets.items():
            self._on_node.setdefault(node, {})[key] = held
        heapq.heappush(self._expiry, (reservation.expires_at, key))
        if before is None:
            return changed | set(sets) | self._pod_nodes_of(key)
        # held before and after, so its pods' holds count neither time
        return {node for node in changed | sets.keys() if before.sets.get(node) != sets.get(node)}

    def renew(self, key: str, sets_per_node: Mapping[str, Iterable[GpuSet]], ttl: float) -> bool:
        """Move the end of `key`'s hold to now + `ttl` when it holds exactly these sets (no node
        changes, and the pods counted against it stay counted); False, changing nothing, otherwise."""
        held = self.holds.get(key)
        if held is None or held.sets != {node: list(sets) for node, sets in sets_per_node.items() if sets}:
            return False
        held.expires_at = self.clock() + ttl
        heapq.heappush(self._expiry, (held.expires_at, key))
        return True

    def release(self, key: str) -> set[str]:
        reservation = self.holds.pop(key, None)
        if reservation is None:
            return set()
        for node in reservation.sets:
            self._forget(node, key)
        return set(reservation.sets) | self._pod_nodes_of(key)

    def confirm(self, key: str, pod: str, namespace: str, bound_to: str) -> set[str]:
        """A pod of `namespace` carrying `key` is bound to `bound_to`: drop one of the held sets,
        the bound node's if it holds one. A pod of another namespace confirms nothing."""
        reservation = self.holds.get(key)
        if reservation is None or pod in reservation.confirmed or not in_namespace(key, namespace):
            return set()
        node = bound_to if reservation.sets.get(bound_to) else next(iter(reservation.sets))
        reservation.sets[node].pop()
        if not reservation.sets[node]:
            del reservation.sets[node]
            self._forget(node, key)
        if not reservation.sets:
            del self.holds[key]
            return {node} | self._pod_nodes_of(key)
        reservation.confirmed.add(pod)
        return {node}

    def expire(self) -> set[str]:
        """Release every hold whose time has run out; returns the nodes whose holds changed."""
        now = self.clock()
        changed: set[str] = set()
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, key = heapq.heappop(self._expiry)
            reservation = self.holds.get(key)
            if reservation is not None and reservation.expires_at == expires_at:
                changed |= self.release(key)
        return changed

    def _forget(self, node: str, key: str) -> None:
        by_key = self._on_node.get(node)
        if by_key is not None:
            by_key.pop(key, None)
            if not by_key:
                del self._on_node[node]

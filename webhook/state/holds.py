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

A hold made for an admission is provisional until the apiserver is seen to have stored what was
admitted. A mutating webhook answers before the object is validated and persisted: a later
webhook or policy may refuse it, a field may be immutable, and a review may be POSTed to the
webhook by someone who is not the apiserver at all. So an admission's hold carries a stamp (the
review's uid, which the admitted object carries as `topology.scheduler/admission`), counts for
`provisional_seconds` only, and becomes firm (for the rest of its TTL) when the watch shows the
stored object, or its pod, with that stamp (`store`). It never displaces the firm hold under its
key: a review of a name can hold beside a stored object's hold, never take it over, until that
object is stored as reviewed. Deletions come from the watch too (`unstore`), never from a review.
Without a watch to confirm them (files, `mutate`), `provisional_seconds` is None and every hold is
firm when made.

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
from typing import Any, Callable, Iterable, Iterator, Mapping

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


@dataclass(frozen=True, slots=True)
class Stored:
    """A workload object as the watch shows it (its metadata): the key its hold is under, the
    admission whose hold it was stored with (None: none of ours), and `gone` once deleted."""

    key: str
    stamp: str | None
    gone: bool = False
    ours: bool = False  # it carries our reservation key for itself (placed by us, or scaled up for)


@dataclass
class Reservation:
    key: str
    sets: dict[str, list[GpuSet]]  # node name -> GPU sets still held there, one per unbound pod
    expires_at: float
    confirmed: set[str] = field(default_factory=set)  # pod keys already counted
    stamp: str | None = None  # the admission that made it (None: made from what is already stored)
    firm_until: float = 0.0  # while provisional: when it would lapse once firm

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.sets)

    @property
    def pods(self) -> int:
        """Pods the hold was made for: one set per pod still unbound, plus those bound since."""
        return sum(len(sets) for sets in self.sets.values()) + len(self.confirmed)


Slot = tuple[str, bool]  # (key, firm): where a hold's sets are counted on a node


class ReservationLedger:
    """Holds by key, and by node for the index's recounts. Not thread safe on its own: the
    cluster index calls it under its lock."""

    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic,
                 provisional_seconds: float | None = None):
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.provisional_seconds = provisional_seconds  # None: no watch confirms holds, all are firm
        self.holds: dict[str, Reservation] = {}  # firm holds
        self.pending: dict[str, Reservation] = {}  # provisional holds, the newest admission's per key
        self.stored: dict[str, str] = {}  # key -> the stamp its stored object (or pod) carries
        self._on_node: dict[str, dict[Slot, list[GpuSet]]] = {}  # node -> slot -> sets (the same lists)
        # (expires_at, key, firm) of every hold made, soonest first: expiry runs before every decision
        # and must not scan all holds. An entry whose hold was since released or renewed is skipped.
        self._expiry: list[tuple[float, str, bool]] = []
        self.pod_holds: dict[str, tuple[str, str, GpuSet]] = {}  # pod key -> (reservation key, node, set)
        # When each pod that holds (or held) first did, while it is pending: a pod hold lasts a
        # hold's TTL from then at most (a sealed pod kept unbound behind another's gate holds no
        # room for good), and a pod whose time is up is not held again by its next event.
        self._pod_since: dict[str, float] = {}
        self._pod_expiry: list[tuple[float, str]] = []
        self._pods_on_node: dict[str, dict[str, tuple[str, GpuSet]]] = {}  # node -> pod key -> (key, set)
        self._pods_of: dict[str, set[str]] = {}  # reservation key -> pod keys holding under it
        self.groups: dict[str, tuple[Any, float]] = {}  # group key -> (its decision, expires_at)
        self._group_expiry: list[tuple[float, str]] = []

    def hold(self, key: str) -> Reservation | None:
        """The newest hold of `key`: its provisional one, else its firm one."""
        return self.pending.get(key) or self.holds.get(key)

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
            if key not in self.holds and key not in self.pending:
                yield held

    def hold_pod(self, pod: str, key: str, namespace: str, node: str, held: GpuSet) -> set[str]:
        """An unbound pod of `namespace` carrying `key`, pinned to `node` with GPU set `held`.
        Returns the nodes whose holds changed."""
        if not in_namespace(key, namespace) or self.pod_holds.get(pod) == (key, node, held):
            return set()
        since = self._pod_since.setdefault(pod, self.clock())
        changed = self._unhold_pod(pod)
        if since + self.ttl_seconds <= self.clock():
            return changed
        heapq.heappush(self._pod_expiry, (since + self.ttl_seconds, pod))
        self.pod_holds[pod] = (key, node, held)
        self._pods_on_node.setdefault(node, {})[pod] = (key, held)
        self._pods_of.setdefault(key, set()).add(pod)
        return changed | {node}

    def drop_pod(self, pod: str) -> set[str]:
        """The pod is bound, finished or gone, or no longer carries a hold: it holds nothing any more."""
        self._pod_since.pop(pod, None)
        return self._unhold_pod(pod)

    def _unhold_pod(self, pod: str) -> set[str]:
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

    def reserve(self, key: str, sets_per_node: Mapping[str, Iterable[GpuSet]], ttl: float | None = None,
                stamp: str | None = None) -> set[str]:
        """Hold GPU sets for `key` until now + TTL (`ttl`, for a claim made elsewhere: what is left
        of it). With the `stamp` of an admission whose object is not seen stored with it yet, the
        hold is provisional (see the module's docstring): it replaces the key's provisional hold
        and leaves its firm one. Otherwise reserving a key again replaces its firm hold, so placing
        a workload again never books it twice. Returns the nodes whose holds changed: where a hold
        is replaced, only the nodes whose sets differ (another replica's allotment changes a few
        nodes of a hundred)."""
        firm = self._firm(key, stamp)
        lasting = self.ttl_seconds if ttl is None else ttl
        before = (self.holds if firm else self.pending).get(key)
        had_any = self.hold(key) is not None
        changed = self._drop((key, firm))
        pending = self.pending.get(key) if firm and stamp is not None else None
        if pending is not None and pending.stamp == stamp:  # its own provisional hold, now firm
            changed |= self._drop((key, False))
            before = None
        sets = {node: list(held) for node, held in sets_per_node.items() if held}
        if not sets:
            return changed | (self._pod_nodes_of(key) if had_any and self.hold(key) is None else set())
        now = self.clock()
        reservation = Reservation(key, sets, now + lasting, stamp=stamp) if firm else Reservation(
            key, sets, now + min(lasting, self.provisional_seconds or lasting), stamp=stamp, firm_until=now + lasting)
        self._put(reservation, firm)
        if not had_any:
            return changed | set(sets) | self._pod_nodes_of(key)
        # held before and after, so its pods' holds count neither time
        return {node for node in changed | sets.keys() if before is None or before.sets.get(node) != sets.get(node)}

    def _put(self, reservation: Reservation, firm: bool) -> None:
        key = reservation.key
        (self.holds if firm else self.pending)[key] = reservation
        for node, held in reservation.sets.items():
            self._on_node.setdefault(node, {})[(key, firm)] = held
        heapq.heappush(self._expiry, (reservation.expires_at, key, firm))

    def renew(self, key: str, sets_per_node: Mapping[str, Iterable[GpuSet]], ttl: float) -> bool:
        """Move the end of `key`'s newest hold to now + `ttl` (a provisional one's once it is firm)
        when it holds exactly these sets (no node changes, and the pods counted against it stay
        counted); False, changing nothing, otherwise."""
        held = self.hold(key)
        if held is None or held.sets != {node: list(sets) for node, sets in sets_per_node.items() if sets}:
            return False
        if key in self.pending:
            held.firm_until = self.clock() + ttl
            return True
        held.expires_at = self.clock() + ttl
        heapq.heappush(self._expiry, (held.expires_at, key, True))
        return True

    def store(self, key: str, stamp: str) -> set[str]:
        """The watch shows `key`'s object (or its pod) stored carrying `stamp`: the provisional hold
        of that admission becomes its key's firm hold (one of an earlier admission of that name
        is void: the stored object is the newer one's). Returns the nodes whose holds changed."""
        if self.stored.get(key) == stamp:
            return set()
        self.stored[key] = stamp
        pending = self.pending.get(key)
        if pending is None or pending.stamp != stamp:
            return set()
        changed = self._drop((key, False)) | self._drop((key, True))
        firm = Reservation(key, pending.sets, pending.firm_until, pending.confirmed, stamp)
        self._put(firm, True)
        return changed | set(firm.sets)

    def unstore(self, key: str, stamp: str | None) -> set[str]:
        """`key`'s object, carrying `stamp` (None: none of ours), is deleted: its holds go, but for
        one of another admission (a newer object of that name, admitted before this deletion was
        seen). Returns the nodes whose holds changed."""
        if stamp is not None and self.stored.get(key) == stamp:
            del self.stored[key]
        changed: set[str] = set()
        for firm, held in ((True, self.holds.get(key)), (False, self.pending.get(key))):
            if held is not None and (held.stamp is None or held.stamp == stamp):
                changed |= self._drop((key, firm))
        return changed | (self._pod_nodes_of(key) if changed and self.hold(key) is None else set())

    def provisional_gpus(self) -> int:
        """GPUs in the sets of provisional holds."""
        return sum(len(ids) for held in self.pending.values() for sets in held.sets.values() for ids in sets)

    def workload_holds(self) -> Iterator[tuple[Reservation, bool]]:
        """Every hold made for a workload, with whether it is firm."""
        for firm, holds in ((True, self.holds), (False, self.pending)):
            for held in holds.values():
                yield held, firm

    def apply(self, fact: Stored) -> set[str]:
        """What the watch shows of a workload: stored with an admission, or deleted."""
        if fact.gone:
            return self.unstore(fact.key, fact.stamp)
        return self.store(fact.key, fact.stamp) if fact.stamp else set()

    def stored_of(self, kind: str) -> set[str]:
        """Keys of the workloads of `kind` seen stored with an admission's stamp."""
        return {key for key in self.stored if key.split("/", 2)[1:2] == [kind]}

    def release(self, key: str, stamp: str | None = None) -> set[str]:
        """Drop every hold of `key`, firm and provisional; with an admission's `stamp`, only the one
        `reserve` with that stamp would replace (placing it again)."""
        if stamp is None:
            changed = self._drop((key, True)) | self._drop((key, False))
        else:
            changed = self._drop((key, self._firm(key, stamp)))
        return changed | self._pod_nodes_of(key) if changed and self.hold(key) is None else changed

    def _firm(self, key: str, stamp: str | None) -> bool:
        """Whether a hold for this admission is firm when made (see `reserve`)."""
        return stamp is None or self.provisional_seconds is None or self.stored.get(key) == stamp

    def _drop(self, slot: Slot) -> set[str]:
        key, firm = slot
        reservation = (self.holds if firm else self.pending).pop(key, None)
        if reservation is None:
            return set()
        for node in reservation.sets:
            self._forget(node, slot)
        return set(reservation.sets)

    def confirm(self, key: str, pod: str, namespace: str, bound_to: str) -> set[str]:
        """A pod of `namespace` carrying `key` is bound to `bound_to`: drop one of the held sets,
        the bound node's if it holds one. A pod of another namespace confirms nothing."""
        firm = key in self.holds
        reservation = self.holds.get(key) or self.pending.get(key)
        if reservation is None or pod in reservation.confirmed or not in_namespace(key, namespace):
            return set()
        node = bound_to if reservation.sets.get(bound_to) else next(iter(reservation.sets))
        reservation.sets[node].pop()
        if not reservation.sets[node]:
            del reservation.sets[node]
            self._forget(node, (key, firm))
        if not reservation.sets:
            del (self.holds if firm else self.pending)[key]
            return {node} | (self._pod_nodes_of(key) if self.hold(key) is None else set())
        reservation.confirmed.add(pod)
        return {node}

    def expire(self) -> set[str]:
        """Release every hold whose time has run out; returns the nodes whose holds changed."""
        now = self.clock()
        changed: set[str] = set()
        while self._pod_expiry and self._pod_expiry[0][0] <= now:
            until, pod = heapq.heappop(self._pod_expiry)
            since = self._pod_since.get(pod)
            if since is not None and since + self.ttl_seconds == until:
                changed |= self._unhold_pod(pod)
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, key, firm = heapq.heappop(self._expiry)
            reservation = (self.holds if firm else self.pending).get(key)
            if reservation is not None and reservation.expires_at == expires_at:
                changed |= self._drop((key, firm))
                if self.hold(key) is None:
                    changed |= self._pod_nodes_of(key)
        return changed

    def _forget(self, node: str, slot: Slot) -> None:
        by_slot = self._on_node.get(node)
        if by_slot is not None:
            by_slot.pop(slot, None)
            if not by_slot:
                del self._on_node[node]

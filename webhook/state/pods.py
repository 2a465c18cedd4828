"""Where each pod is counted: the one part of the index that applies pod facts.

A pod the index knows is counted in at most these places, all kept here together: the GPUs it
holds on its node (`NodeState.pods`, and `terminating` while it is deleted), or on a node not seen
yet (`orphans`); what else it requests (`ResourceUsage`); the reservation it carries (`holders`,
`reservations`); the ledger's hold of an unbound pod; and, pending, the waits (`Waiting`) and our
gate (`GatedPods`). Pods arrive as `PodFacts` (objects/feed.py reads them from the API's dicts).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Protocol

from ..core.gpus import parse_gpu_set
from ..core.injection import GateRecord
from .dra import ClaimDemand, ClaimRefs
from .gated import GatedGroup, GatedPod, GatedPods
from .holds import ReservationLedger, held_by, in_namespace
from .tree import NodeState
from .usage import Requests, ResourceUsage
from .waits import Waiter, Waiting

DomainPath = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class PodFacts:
    """What the index reads of a Pod. Not frozen, though nothing changes one: a frozen dataclass
    of these many fields takes 4.5 us to make against 1.3 us, and a relist makes one per pod."""

    key: str  # its uid (namespace/name when it has none)
    namespace: str
    node_name: str | None  # bound to; None while pending
    finished: bool  # Succeeded or Failed: it holds nothing any more
    terminating: bool  # being deleted: its GPUs are still taken, and free soon
    gpus: int  # nvidia.com/gpu it asks for
    covered_by_claim: bool  # the scheduler turned its extended resources into a claim (status says)
    requests: Requests  # every other resource it asks for
    reservation: str | None  # our reservation key on it
    admission: str | None  # the review whose hold it was admitted with, when it is the admitted object
    gpu_ids: str | None  # the GPU set we hinted
    waiting_for: DomainPath | None  # the domain of a pinned wait it carries
    # (reservation key, node, GPU set) it holds unbound: a single-pod placement naming one node
    held: tuple[str, str, tuple[int, ...]] | None
    gate: GateRecord | str | None  # our gate's sealed record, why it is not believed, or None: not gated
    claims: ClaimRefs  # its resourceClaims and PodGroup
    obj: Mapping  # the pod as read: the releaser patches a gated pod from it


@dataclass(frozen=True, slots=True)
class PodGone:
    """A Pod deleted from the API."""

    key: str
    namespace: str
    reservation: str  # "" when it carries none
    admission: str | None = None  # the review whose hold it was admitted with


class IndexForPods(Protocol):
    """What the pod part asks of the index around it (state/index.py)."""

    ledger: ReservationLedger
    changes: int

    def node(self, name: str) -> NodeState | None: ...
    def changed(self, node: NodeState) -> None: ...  # its pods or requests changed: settle its aggregates
    def recount(self, names: Collection[str]) -> None: ...  # the ledger's holds changed on these nodes
    def shift_freeing(self, node: NodeState, delta: int) -> None: ...
    def through_claims(self, facts: PodFacts) -> bool: ...  # its GPUs are counted from its claim's devices
    def claims_demand(self, namespace: str, claims: ClaimRefs) -> ClaimDemand: ...
    def pick(self, node: NodeState, gpus: int, taken: set[int]) -> tuple[int, ...]: ...


class PodRecords:
    """Every per-pod map of the index, and the rules that keep them consistent."""

    def __init__(self, nodes: IndexForPods) -> None:
        self.nodes = nodes
        self.orphans: dict[str, dict[str, tuple[int, tuple[int, ...]]]] = {}  # pods bound to unknown nodes
        self.orphans_ending: dict[str, set[str]] = {}  # those of them being deleted
        self.on_node: dict[str, str] = {}  # pod key -> node name its GPUs are counted on
        self.usage = ResourceUsage()  # bound pods' requests of every resource but GPUs
        self.holders: dict[str, set[str]] = {}  # reservation key -> bound pods carrying it
        self.reservations: dict[str, str] = {}  # bound pod key -> the reservation key it carries
        self.waiters = Waiting()  # pending pods of pinned waits (placement/protection.py)
        self.gated = GatedPods()  # pending pods held by our scheduling gate

    def apply(self, pod: PodFacts) -> None:
        """A pod added or changed (files and watch events alike)."""
        key, node_name = pod.key, pod.node_name
        if pod.admission and pod.reservation and in_namespace(pod.reservation, pod.namespace):
            self.nodes.recount(self.nodes.ledger.store(pod.reservation, pod.admission))  # stored as admitted
        through_claims = self.nodes.through_claims(pod)
        gpus = 0 if through_claims else pod.gpus  # its claim's devices are what it uses: counted once, there
        pending = not node_name and not pod.finished
        if pending:
            self._note_waiter(key, pod, gpus)
            if self.gated.note(key, pod.gate, pod.obj, self.nodes.ledger.clock()):
                self.nodes.changes += 1
        else:  # most pods, at every event: neither a waiter nor gated any more
            self.waiters.forget(key)
            self.gated.forget(key)
        if not node_name or pod.finished:
            self._forget(key)
            hold = pod.held if pending and gpus > 0 else None
            ledger = self.nodes.ledger
            self.nodes.recount(ledger.drop_pod(key) if hold is None
                               else ledger.hold_pod(key, hold[0], pod.namespace, hold[1], hold[2]))
            return
        self._use(key, node_name, pod.requests)
        reservation = pod.reservation
        if gpus <= 0:
            self.forget_gpus(key)
            self.nodes.recount(self.nodes.ledger.drop_pod(key))
            if reservation and (through_claims or self._claims_gpus(pod)):
                # GPUs from claims: bound, its devices are allocated and counted, so the hold goes
                self.nodes.recount(self.nodes.ledger.confirm(reservation, key, pod.namespace, node_name))
            return
        node = self.nodes.node(node_name)
        if (self.on_node.get(key) == node_name and node is not None and node.pods[key][0] == gpus
                and self.reservations.get(key) == (reservation or None)):
            if pod.terminating and key not in node.terminating:
                self._mark_terminating(node, key)
            elif not pod.terminating and key in node.terminating:  # the last word counts, as a relist's would
                self._unmark_terminating(node, key)
            return  # other status updates of a counted pod change nothing we count
        self.forget_gpus(key)
        self.nodes.recount(self.nodes.ledger.drop_pod(key))
        self.on_node[key] = node_name
        if reservation:
            self.reservations[key] = reservation
            if in_namespace(reservation, pod.namespace):
                # a key is its own namespace's: a pod elsewhere never counts as another's running pod
                self.holders.setdefault(reservation, set()).add(key)
        if node is None:
            self.orphans.setdefault(node_name, {})[key] = (gpus, ())
            if pod.terminating:
                self.orphans_ending.setdefault(node_name, set()).add(key)
            return
        self._bind(node, key, gpus, pod.gpu_ids)
        self.nodes.changed(node)
        if pod.terminating:
            self._mark_terminating(node, key)
        if reservation:
            self.nodes.recount(self.nodes.ledger.confirm(reservation, key, pod.namespace, node_name))

    def gone(self, pod: PodGone) -> None:
        """A pod is gone. A pod placed on its own (not from a workload's template) is its own
        workload: its deletion ends the reservation it may still hold."""
        self._forget(pod.key)
        self.waiters.forget(pod.key)
        self.gated.deleted(pod.key)
        self.nodes.recount(self.nodes.ledger.drop_pod(pod.key))
        if pod.reservation and held_by(pod.reservation, pod.namespace, "Pod"):
            self.nodes.recount(self.nodes.ledger.unstore(pod.reservation, pod.admission))

    def adopt(self, node: NodeState) -> None:
        """A node seen (again) takes the pods already bound to it, those being deleted too."""
        node.pods = self.orphans.pop(node.name, {})
        node.terminating = self.orphans_ending.pop(node.name, set())

    def orphan(self, node: NodeState) -> None:
        """A deleted node's pods may still be deleted later: kept until then."""
        if node.pods:
            self.orphans[node.name] = node.pods
        if node.terminating:
            self.orphans_ending[node.name] = node.terminating

    def counted(self) -> set[str]:
        """Keys of every pod counted (a relist forgets the others)."""
        return set(self.on_node) | self.usage.pods() | set(self.waiters.pods) | set(self.gated.pods) \
            | set(self.gated.refused)

    def running(self) -> dict[str, int]:
        """Bound pods per reservation key."""
        return {key: len(pods) for key, pods in self.holders.items()}

    def gated_groups(self, started: Collection[str] = (), sizes: Mapping[str, int] | None = None) -> list[GatedGroup]:
        return self.gated.ready(self.running(), started, sizes)

    def gated_unsure(self) -> dict[str, GatedPod]:
        return self.gated.unsure(self.running())

    def staying(self, reservation: str | None) -> Callable[[NodeState], int]:
        """GPUs on a node of the bound pods carrying `reservation`, read per node asked about (a
        workload's bound pods can be thousands, and a question reads a few nodes)."""
        holders = self.holders.get(reservation or "", set())
        return lambda node: sum(gpus for pod, (gpus, _) in node.pods.items() if pod in holders) if holders else 0

    def _claims_gpus(self, pod: PodFacts) -> bool:
        if not pod.claims.entries:
            return False
        demand = self.nodes.claims_demand(pod.namespace, pod.claims)
        return bool(demand.per_pod or demand.whole_node or demand.shared or demand.group_shared or demand.pinned)

    def _note_waiter(self, key: str, pending: PodFacts, gpus: int) -> None:
        """Keep or forget a pending pod as a waiter: asking for GPUs, with our `waiting-for`. It
        keeps the time it was first seen waiting."""
        path = pending.waiting_for if gpus > 0 else None
        if path is None:
            self.waiters.forget(key)
            return
        seen = self.waiters.get(key)
        since = seen.since if seen is not None and seen.path == path else self.nodes.ledger.clock()
        self.waiters.put(key, Waiter(pending.reservation or key, path, gpus, since))

    def _mark_terminating(self, node: NodeState, key: str) -> None:
        node.terminating.add(key)
        self.nodes.shift_freeing(node, node.pods[key][0])

    def _unmark_terminating(self, node: NodeState, key: str) -> None:
        self.nodes.shift_freeing(node, -node.pods[key][0])
        node.terminating.discard(key)

    def _bind(self, node: NodeState, key: str, gpus: int, hinted: str | None) -> None:
        taken = {i for _, ids in node.pods.values() for i in ids}
        ids: tuple[int, ...] = ()
        if hinted:
            try:
                wanted = parse_gpu_set(hinted)
            except ValueError:
                wanted = ()
            if len(wanted) == gpus and not taken.intersection(wanted) and all(i < node.gpus for i in wanted):
                ids = wanted  # the device plugin honoured our hint (or we assume it did)
        node.pods[key] = (gpus, ids or self.nodes.pick(node, gpus, taken))

    def _forget(self, key: str) -> None:
        self.forget_gpus(key)
        self._use(key, None, ())

    def _use(self, key: str, node_name: str | None, requests: Requests) -> None:
        """Count a pod's requests of other resources on the node it is bound to (None: nowhere)."""
        for changed in self.usage.use(key, node_name, requests):
            node = self.nodes.node(changed)
            if node is not None:  # its free GPUs are as they were; what uses them may not be
                self.nodes.changed(node)

    def forget_gpus(self, key: str) -> None:
        """Count the pod's GPUs nowhere (its claim's devices count them now, or it is gone)."""
        node_name = self.on_node.pop(key, None)
        if node_name is None:
            return
        reservation = self.reservations.pop(key, None)
        holders = self.holders.get(reservation or "")
        if holders is not None:
            holders.discard(key)
            if not holders:
                del self.holders[str(reservation)]
        node = self.nodes.node(node_name)
        if node is not None:
            if key in node.terminating:
                self._unmark_terminating(node, key)
            node.pods.pop(key, None)
            self.nodes.changed(node)
        else:
            orphans = self.orphans.get(node_name, {})
            orphans.pop(key, None)
            if not orphans:
                self.orphans.pop(node_name, None)
            ending = self.orphans_ending.get(node_name, set())
            ending.discard(key)
            if not ending:
                self.orphans_ending.pop(node_name, None)


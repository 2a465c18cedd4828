"""The feed: Node and Pod objects, as the API returns them (from a watch, a list or
`kubectl get -o yaml` files: one code path), read into the facts the cluster index applies, and
the index built from such objects. DRA objects and PodGroups are read in dra_objects.py,
autoscalers' objects in autoscaler_objects.py.
"""
from __future__ import annotations

import dataclasses
import hmac
import time
from typing import Callable, Iterable, Mapping, Sequence

import orjson

from ..core.gpus import (NVLINK_DOMAINS_ANNOTATION, parse_bandwidth_gbps, parse_gpu_set, parse_nvlink_domains,
                         pod_gpus, quantity_to_int)
from ..core.injection import (ADMISSION, GATE, GPU_IDS, HOLD_SEAL, RESERVATION, WAITING_FOR, GateRecord, gate_record,
                              parse_domain_path, seal_hold)
from ..core.memo import Memo
from ..core.model import GPU_RESOURCE, MAPPINGS
from ..core.orderings import DEFAULT as DEFAULT_ORDERINGS, Orderings
from ..core.resources import node_allocatable, pod_requests
from ..settings.config import Config, HardwareProfile
from ..settings.presets import HOSTNAME_LABEL
from ..state.dra import DRA_KINDS, ClaimRefs
from ..state.holds import Stored, held_by, reservation_key
from ..state.index import ClusterIndex, Fact, NodeGone
from ..state.pods import PodFacts, PodGone
from ..state.members import NodeInfo, nvlink_domains
from . import autoscaler_objects, dra_objects
from .groups import KUBEFLOW_KINDS
from .kinds import POD, REGISTRY, WorkloadKind
from .user_annotations import NETWORK_BANDWIDTH

BANDWIDTH_LABEL = NETWORK_BANDWIDTH  # a node's label of the key a workload's annotation asks with
PRODUCT_LABEL = "nvidia.com/gpu.product"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# Taints the node lifecycle controller sets from conditions (not-ready, unreachable, pressure...):
# they pass, so they make a node out of service for now, not a filter on who may use it.
_LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"
_FINISHED_PHASES = ("Succeeded", "Failed")
# From files, what a kind's count depends on is read before it: slices before the nodes they
# name, claims and templates before the pods that use them; autoscalers' pools with the Nodes.
_FEED_ORDER = {"DeviceClass": 0, "ResourceSlice": 1, "Node": 2, "ResourceClaimTemplate": 3, "ResourceClaim": 3,
               "PodGroup": 3, "ComputeDomain": 3, "Pod": 4}


def index_of(config: Config, nodes: Iterable[Mapping], pods: Iterable[Mapping] = (),
             clock: Callable[[], float] = time.monotonic, orderings: Orderings = DEFAULT_ORDERINGS) -> ClusterIndex:
    """The index of these objects: Nodes and Pods, and any of the DRA kinds (dra.DRA_KINDS) and
    autoscalers' objects mixed in, as `kubectl get nodes,pods,resourceslices -o yaml` prints them."""
    objects = sorted([*nodes, *pods], key=lambda obj: _FEED_ORDER.get(str(obj.get("kind", "Node")), 2))
    facts = [fact for fact in (fact_of(obj, config) for obj in objects) if fact is not None]
    index = ClusterIndex(config, max([8] + [fact.gpus for fact in facts if isinstance(fact, NodeInfo)]), clock,
                         orderings)
    for fact in facts:
        index.apply(fact)
    return index


def upsert(index: ClusterIndex, obj: Mapping, kind: str | None = None) -> None:
    """An object of any kind the index reads, added or changed. List items carry no kind, so a
    list names it (`kind`); otherwise the object's own, and a Node when it names none."""
    fact = fact_of(obj, index.config, kind)
    if fact is not None:
        index.apply(fact)


def upserter(index: ClusterIndex, kind: str) -> Callable[[Mapping], None]:
    """`upsert` for a list and watch of one kind: a relist calls it once per object (a million
    pods), so what the kind decides is decided once, here."""
    if kind != "Pod":
        return lambda obj: upsert(index, obj, kind)
    apply, seal_key = index.apply, index.config.seal_key
    return lambda pod: apply(pod_facts(pod, seal_key))


def delete(index: ClusterIndex, obj: Mapping, kind: str | None = None) -> None:
    """An object of any kind the index reads is gone (only its metadata is read)."""
    fact = gone_of(obj, kind)
    if fact is not None:
        index.apply(fact)


def fact_of(obj: Mapping, config: Config, kind: str | None = None) -> Fact | None:
    """What the index reads of an object; None for a kind it does not read."""
    kind = kind or str(obj.get("kind", "Node"))
    if kind == "Pod":
        return pod_facts(obj, config.seal_key)
    if kind == "Node":
        return parse_node(obj, config)
    if kind in DRA_KINDS:
        return dra_objects.dra_fact(kind, obj)
    if kind in STORED_KINDS:
        return stored(obj, kind)
    return autoscaler_objects.growth_fact(obj, kind)


def gone_of(obj: Mapping, kind: str | None = None) -> Fact | None:
    """The deletion of an object; None for a kind the index does not read."""
    kind = kind or str(obj.get("kind", "Node"))
    if kind == "Pod":
        return pod_gone(obj)
    if kind == "Node":
        return NodeGone(str((obj.get("metadata") or {}).get("name", "")))
    if kind in DRA_KINDS:
        return dra_objects.dra_gone(kind, obj)
    if kind in STORED_KINDS:
        return stored(obj, kind, gone=True)
    return autoscaler_objects.growth_gone(obj, kind)


# ----- Workloads we hold for, as stored --------------------------------------------------------

# Every kind that holds GPUs once placed, but Pods (the pods' own stream reads them whole): the
# watch reads their metadata to tell which admissions' holds the apiserver stored (state/holds.py).
STORED_KINDS: dict[str, WorkloadKind] = {kind.key: kind for kind in REGISTRY if kind.reserves and kind is not POD}


def stored(obj: Mapping, kind: str, gone: bool = False) -> Stored:
    """A workload object's metadata as the ledger reads it: the key of its hold and the admission
    it carries, both only where the key is its own (a ReplicaSet carries its Deployment's
    annotations, and must not stand for it); else its own key, with no admission."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    namespace, key = str(meta.get("namespace") or ""), annotations.get(RESERVATION)
    if isinstance(key, str) and held_by(key, namespace, kind):
        return Stored(key, _text(annotations.get(ADMISSION)), gone, ours=True)
    return Stored(reservation_key(namespace, kind, str(meta.get("name") or "")), None, gone)


def stored_key(obj: Mapping, kind: str) -> str:
    return stored(obj, kind).key


# ----- Nodes -----------------------------------------------------------------------------------

def _node_profile(labels: Mapping[str, str], config: Config) -> HardwareProfile:
    return config.profile_for(labels.get(PRODUCT_LABEL, ""))


def parse_node(node: Mapping, config: Config) -> NodeInfo:
    """A Node object's facts; malformed fields count as 'no GPUs', never as an error."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = dict(meta.get("labels") or {})
    annotations = meta.get("annotations") or {}
    try:
        alloc = quantity_to_int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0))
    except ValueError:
        alloc = 0
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    blocking = [(t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
                for t in spec.get("taints") or () if t.get("effect") in _BLOCKING_EFFECTS]
    lifecycle = sorted(t[0] for t in blocking if t[0].startswith(_LIFECYCLE_TAINT_PREFIX))
    taints = tuple(t for t in blocking if not t[0].startswith(_LIFECYCLE_TAINT_PREFIX))
    out = ("cordoned" if spec.get("unschedulable") else "NotReady" if not ready
           else f"tainted {lifecycle[0]}" if lifecycle else "")
    profile = _node_profile(labels, config)
    try:
        declared: tuple[tuple[int, ...], ...] | None = parse_nvlink_domains(annotations[NVLINK_DOMAINS_ANNOTATION])
    except (KeyError, ValueError):
        declared = None
    try:
        bandwidth = parse_bandwidth_gbps(labels[BANDWIDTH_LABEL])
    except (KeyError, ValueError):
        bandwidth = None
    return NodeInfo(name=meta.get("name", ""), labels=labels, out=out, taints=taints, gpus=alloc,
                    nvlink_domains=nvlink_domains(declared, profile, alloc), profile=profile,
                    bandwidth_gbps=bandwidth, other_allocatable=node_allocatable(status), plugin_gpus=alloc,
                    declared_domains=declared)


# ----- Pods ------------------------------------------------------------------------------------

def pod_key(pod: Mapping) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


_gpus_by_shape = Memo()
_requests_by_shape = Memo()


def demand_shape(spec: Mapping) -> bytes | str:
    """All that a pod's demand (gpus.pod_gpus, resources.pod_requests) reads of its spec: every
    container's resources, then, where the spec has either, each init container's with its
    restartPolicy and the overhead. Pods made from one template share it. As JSON text (orjson:
    a quarter of repr's time, a million times at a first sync), and as repr for what JSON cannot
    write (objects read from YAML: keys that are not text, dates). JSON tells "1" from 1 and ends
    each list where it ends; it writes NaN and infinities as null, a collision that changes no
    answer, since neither is a GPU count or a request."""
    parts: object = [container.get("resources") for container in spec.get("containers") or ()]
    if "initContainers" in spec or "overhead" in spec:
        parts = {"containers": parts, "overhead": spec.get("overhead"),  # a map: never a containers-only shape
                 "init": [(init.get("resources"), init.get("restartPolicy")) for init in spec.get("initContainers") or ()]}
    try:
        return orjson.dumps(parts)
    except TypeError:
        return repr(parts)


def _gpus_asked(spec: Mapping) -> int:
    try:
        return pod_gpus(spec)
    except ValueError:
        return 0


def _requests(spec: Mapping) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(pod_requests(spec).items()))


def pod_facts(pod: Mapping, seal_key: bytes) -> PodFacts:
    """What the index reads of a Pod; what only a pending pod carries is read only for one."""
    # Read once per pod at every relist and watch event (a million at a first sync): fields are
    # passed by position.
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    namespace = meta.get("namespace") or ""
    node_name = spec.get("nodeName") or None
    finished = status.get("phase") in _FINISHED_PHASES
    shape = demand_shape(spec)
    gpus = _gpus_by_shape.get(shape, _gpus_asked, spec)
    pending = not node_name and not finished
    reservation = annotations.get(RESERVATION)
    return PodFacts(
        pod_key(pod), str(namespace), node_name, finished,
        bool(meta.get("deletionTimestamp")), gpus,
        # covered_by_claim reads only this field, which most pods lack: looked at first, it spares
        # them the call (its type checks cost more than the rest of this line)
        bool(status.get("extendedResourceClaimStatus")) and dra_objects.covered_by_claim(pod),
        _requests_by_shape.get(shape, _requests, spec) if node_name and not finished else (),
        str(reservation) if reservation else None, _text(annotations.get(ADMISSION)), annotations.get(GPU_IDS),
        parse_domain_path(annotations.get(WAITING_FOR)) if pending else None,
        pending_hold(annotations, spec, gpus, seal_key) if pending else None,
        gated(pod, seal_key) if pending else None,
        dra_objects.claim_refs(spec) if spec.get("resourceClaims") else _NO_CLAIMS, pod)


_NO_CLAIMS = ClaimRefs()


def pod_gone(pod: Mapping) -> PodGone:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return PodGone(pod_key(pod), str(meta.get("namespace") or ""), str(annotations.get(RESERVATION) or ""),
                   _text(annotations.get(ADMISSION)))


def _text(value: object) -> str | None:
    return str(value) if value else None


def pending_hold(annotations: Mapping, spec: Mapping, gpus: int, seal_key: bytes
                 ) -> tuple[str, str, tuple[int, ...]] | None:
    """(reservation key, node, GPU set) an unbound pod holds: one carrying our reservation key and
    the GPU set we chose, with node affinity naming one node (a single-pod placement), all three
    under our seal (HOLD_SEAL): annotations copied from a dry run or another pod hold nothing. A
    pod pinned to a domain of several nodes names no node: its workload's hold covers it."""
    reservation, hinted, seal = annotations.get(RESERVATION), annotations.get(GPU_IDS), annotations.get(HOLD_SEAL)
    if not reservation or not hinted or not isinstance(seal, str) or gpus <= 0:
        return None
    try:
        held = parse_gpu_set(str(hinted))
    except ValueError:
        return None
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    preferred = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    terms = [*(required or ()), *(p.get("preference") for p in preferred)]
    named: set[str] = set()
    for term in terms:
        for expr in (term or {}).get("matchExpressions") or ():
            values: Sequence = expr.get("values") or ()
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In" and len(values) == 1:
                named.add(str(values[0]))
    if len(named) != 1 or len(held) != gpus:
        return None
    node = named.pop()
    if not hmac.compare_digest(seal, seal_hold(seal_key, str(reservation), str(hinted), node)):
        return None
    return str(reservation), node, held


def holds_our_gate(pod: Mapping) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    return isinstance(gates, list) and any(isinstance(g, MAPPINGS) and g.get("name") == GATE for g in gates)


def gated(pod: Mapping, key: bytes) -> GateRecord | str | None:
    """The sealed record of a pod our gate holds, with the owner it is released with; why it is not
    believed (the releaser cannot decide it: it stays gated, listed by `kubectl get pods` as
    SchedulingGated, and is reported); None for any other pod."""
    if not holds_our_gate(pod):
        return None
    meta = pod.get("metadata") or {}
    if not isinstance(meta, MAPPINGS) or not meta.get("name"):
        return "it has no name"
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, MAPPINGS):
        return "its annotations are not a map"
    record = gate_record(annotations, str(meta.get("namespace") or ""), key)
    if isinstance(record, str):
        return record
    owner, why = _named_owner(meta, record.reservation)
    return why if why is not None else dataclasses.replace(record, owner=owner)


# The kinds whose pods they make themselves: a gated pod whose reservation names one of these must
# be made by that very object (its controller), or it is a copy (a replay) and is never released.
_DIRECT_OWNERS = frozenset({"Job", *KUBEFLOW_KINDS})


def _named_owner(meta: Mapping, reservation: str) -> tuple[str, str | None]:
    """(the uid of the pod's controller where its reservation names it, "" where the reservation
    names no controller of its pods: a JobSet's, a group's; why not, where it names one the pod's
    controller is not)."""
    _, kind, name = (reservation.split("/", 2) + ["", ""])[:3]
    if kind not in _DIRECT_OWNERS:
        return "", None
    owners = meta.get("ownerReferences") or ()
    controller = next((o for o in owners if isinstance(o, MAPPINGS) and o.get("controller") is True), None) \
        if isinstance(owners, list) else None
    if controller is None or controller.get("kind") != kind or controller.get("name") != name \
            or not controller.get("uid"):
        made_by = f"{controller.get('kind')} {controller.get('name')}" if controller else "no controller"
        return "", (f"its reservation names {kind} {name}, but it was made by {made_by}: a copy of another "
                    "workload's pod is never released with it")
    return str(controller["uid"]), None

"""The AdmissionReview envelope: a parsed review in, the review to send back out.

Two error channels, decided here: a body that is not an AdmissionReview raises MalformedReview
(the app answers HTTP 400 with its one-line message); everything about the object itself is an
answer inside a 200 review (allowed, patched, warned or denied). An exception anywhere below
`review` is a bug: the object is admitted unmodified with a warning (fail open), logged, and
reported as outcome "failed-open" for the app to count.

Flow: kind and operation we handle -> object of ours -> the fields we use have their API types ->
not a pod of a template we already placed (unless its pinned domain lost the capacity to
ever hold it: then it alone is repaired), not bound to a node -> ready -> read the request (from
the object without our earlier additions) -> an UPDATE of a workload we placed keeps that
placement -> a suspended workload waits for its queue (placed on the UPDATE that un-suspends it)
-> place and reserve -> mutate -> JSONPatch -> response. A DELETE of a workload we
placed releases what its reservation still holds, and is always allowed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core import injection
from ..core.config import Config
from ..core.gpus import pod_gpus
from ..core.growth import POOL_LABELS
from ..core.ledger import held_by, reservation_key
from ..core.model import (EXCEEDS_CLUSTER, EXCEEDS_MAX_DOMAIN, GROUP_MISMATCH, GROWS_POOL, UNKNOWN_DOMAIN,
                          UNKNOWN_LEVEL, Decision, Outcome, PlacementRequest, Strategy, quoted)
from ..core.placer import group_decision, place, place_group, place_shared, release_shared
from . import alignment, mutation, podgroups, provisioning, workload
from .groups import GROUP_SIZE
from .kinds import KINDS
from .patch import encode, make_patch
from .user_annotations import GPU_COUNT, MAX_DOMAIN, PEER_REQUIRED, PREFERRED_DOMAIN, InvalidWorkload

if TYPE_CHECKING:
    from ..core.cluster import ClusterIndex, ScaleUps

log = logging.getLogger(__name__)

REVIEW_API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
WARNING_MAX_CHARS = 256  # the apiserver truncates longer warnings once its budget is spent
# Objects of the kinds we handle nest about 20 levels at most (managedFields included); far deeper
# would exhaust Python's recursion in copying and diffing, so it is denied up front.
MAX_DEPTH = 100
DENIED_CODE = 403
# Every outcome of a review, and what it means: the label values of topology_placement_decisions_total
# (all but "ignored", counted in latency only), the log's and the audit annotations' `outcome`, and
# docs/reference/metrics.md (generated from this mapping by .ci/reference_docs.py).
OUTCOMES: Mapping[str, str] = {
    "placed": "placed where it fits now",
    "waiting": "admitted to wait for room: pinned to, held for (our scheduling gate) or preferring the domain "
               "where it fits first ([waiting](docs/concepts.md#waiting))",
    "waiting-for-nodes": "admitted to wait for nodes to be added: the nodes there are cannot hold it even when idle "
                         "([autoscalers](docs/autoscalers.md))",
    "waiting-for-growth": "steered to a node pool an autoscaler can grow: the nodes there are have no room "
                          "([autoscalers](docs/autoscalers.md))",
    "denied": "refused: invalid input, or a workload no node could ever hold with `refuse_unplaceable`",
    "failed-open": "admitted unmodified because of an error of ours (also counted in "
                   "`topology_admission_fail_open_total`)",
    "not-ready": "admitted unmodified while the cluster view is not ready",
    "released": "a workload we placed is deleted: what its unbound pods still held is freed",
    "suspended": "a suspended workload (a Job a queue such as Kueue holds back) admitted unplaced, holding nothing; "
                 "placed by the update that un-suspends it",
    "repaired": "a pod of a placed workload whose pinned domain lost the capacity to ever hold it, placed again alone",
    "demand-unknown": "admitted as written: GPUs asked through a ResourceClaimTemplate or claim not known yet "
                      "([DRA](docs/dra.md))",
    "constrained": "a PodGroup or Workload given the topology key of the level it asks for ([DRA](docs/dra.md))",
    "aligned": "a ResourceClaimTemplate given the device constraint it asks for ([DRA](docs/dra.md))",
    "ignored": "nothing to place or keep (not ours, or an object or operation left alone); admitted unchanged",
}
_OUTCOMES = {Outcome.PLACED: "placed", Outcome.WAIT: "waiting"}
# Waits the nodes there are cannot end, counted apart: only added nodes (a pool's, or any) can.
_WAITS_BY_CODE = {GROWS_POOL: "waiting-for-growth", **dict.fromkeys(mutation.WAITS_FOR_NODES, "waiting-for-nodes")}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


class MalformedReview(ValueError):
    """The body is not an AdmissionReview; the app answers HTTP 400 with str(err)."""


@dataclass(frozen=True)
class AdmissionResult:
    review: dict  # AdmissionReview to send back, same apiVersion as received (v1 or v1beta1)
    uid: str
    kind: str  # "Pod", "Job", ... ("" when the review had none)
    namespace: str
    name: str  # metadata.name, else generateName
    outcome: str  # one of OUTCOMES
    strategy: str | None
    decision: Decision | None
    warnings: tuple[str, ...]
    error: str | None  # failed-open only: exception type and message, for logs; never object contents
    patch: tuple[dict, ...] = ()  # the JSON Patch operations in the answer
    admitted: dict | None = None  # the object as admitted (the patch applied); None when denied


@dataclass(frozen=True)
class _Request:
    api_version: str
    uid: str
    group: str
    kind: str
    operation: str
    namespace: str
    name: str
    obj: dict | None
    old: dict | None  # UPDATE: the stored object
    dry_run: bool


def review(body: object, index: "ClusterIndex", config: Config,
           readiness: tuple[bool, str] = (True, "")) -> AdmissionResult:
    """Raises MalformedReview for a body that is not an AdmissionReview; never anything else."""
    request = _parse(body)
    try:
        return _admit(request, index, config, readiness)
    except Exception as err:  # fail open: a bug of ours must not block the user's workload
        error = f"{type(err).__name__}: {err}"[:300]
        log.exception("failed open on %s %s/%s (uid %s)", request.kind, request.namespace, request.name, request.uid)
        who = f"{request.kind} {request.namespace}/{request.name}"
        return _result(request, "failed-open", warnings=[
            f"topology-webhook failed on {who} ({type(err).__name__}); admitted without topology placement"],
            error=error)


def make_review(obj: Mapping, operation: str = "CREATE", namespace: str | None = None, dry_run: bool = False,
                uid: str | None = None) -> dict:
    """A v1 AdmissionReview for `obj` shaped as the apiserver sends it (offline `mutate`, tests).
    Without a uid, one is derived from the object so the same manifest gives the same review."""
    meta = workload.mapping_of(obj.get("metadata"))
    group, _, version = str(obj.get("apiVersion") or "").rpartition("/")
    kind = str(obj.get("kind") or "")
    if uid is None:
        digest = hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
        uid = str(uuid.UUID(digest[:32]))
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": kind.lower() + "s"}
    request = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
               "namespace": namespace or meta.get("namespace") or "default", "operation": operation,
               "userInfo": {"username": "topology-webhook-offline"}, "object": dict(obj), "oldObject": None,
               "dryRun": dry_run, "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}
    if meta.get("name"):
        request["name"] = meta["name"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def _parse(body: object) -> _Request:
    if not isinstance(body, Mapping):
        raise MalformedReview(f"body is a JSON {type(body).__name__}, not an AdmissionReview object")
    if body.get("kind") != "AdmissionReview":
        raise MalformedReview(f"kind is {quoted(body.get('kind'))}, expected 'AdmissionReview'")
    api_version = body.get("apiVersion")
    if api_version not in REVIEW_API_VERSIONS:
        raise MalformedReview(f"apiVersion {quoted(api_version)} is not one of {', '.join(REVIEW_API_VERSIONS)}")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise MalformedReview("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReview("request.uid is missing or not a string")
    operation = request.get("operation")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise MalformedReview(f"request.object is not an object on {operation}")
    gvk = workload.mapping_of(request.get("kind"))
    meta = workload.mapping_of(obj.get("metadata") if isinstance(obj, dict) else None)
    group = gvk.get("group")
    if group is None and isinstance(obj, dict):
        group = str(obj.get("apiVersion") or "").rpartition("/")[0]
    kind = gvk.get("kind") or (obj.get("kind") if isinstance(obj, dict) else "") or ""
    return _Request(
        api_version=api_version, uid=uid, group=str(group or ""), kind=str(kind), operation=str(operation or ""),
        # request.namespace is authoritative: controller-made pods may lack metadata.namespace
        namespace=str(request.get("namespace") or meta.get("namespace") or "default"),
        name=str(meta.get("name") or meta.get("generateName") or request.get("name") or ""),
        obj=obj if isinstance(obj, dict) else None,
        old=request.get("oldObject") if isinstance(request.get("oldObject"), dict) else None,
        dry_run=request.get("dryRun") is True)


def _admit(request: _Request, index: "ClusterIndex", config: Config,
           readiness: tuple[bool, str]) -> AdmissionResult:
    kind, obj = request.kind, request.obj
    if request.operation == "DELETE":
        return _released(request, index)
    if obj is not None and request.operation == "CREATE" and podgroups.handles(request.group, kind):
        return _pod_group(request, obj, config)
    if obj is not None and request.operation == "CREATE" and alignment.handles(request.group, kind):
        return _claim_template(request, obj, index)
    if obj is None or not workload.supports(request.group, kind) or not workload.is_ours(kind, obj, config):
        return _result(request, "ignored")
    # Un-suspended (a queue such as Kueue admitted it): placed now, as if created now, inside the
    # node selection the queue wrote; the template's scheduling fields may change in this update.
    admitted_by_queue = (request.operation == "UPDATE" and workload.suspended(kind, request.old)
                         and not workload.suspended(kind, obj))
    if (request.operation == "UPDATE" and request.old is not None and workload.suspended(kind, obj)
            and not workload.suspended(kind, request.old)):
        # Suspended again (its queue preempted it): its pods go, and so does the hold for the ones
        # not bound yet; un-suspended later, it is placed afresh.
        return _released(request, index)
    if request.operation not in KINDS[kind].operations and not admitted_by_queue:
        return _result(request, "ignored")
    if _deeper_than(obj, MAX_DEPTH):
        return _denied(request, f"{workload.display_name(kind, obj, request.namespace)}: the object is nested more "
                                f"than {MAX_DEPTH} levels deep; allowed: at most {MAX_DEPTH} levels")
    try:
        workload.check_shape(kind, obj, request.namespace)
    except InvalidWorkload as err:
        return _denied(request, str(err))
    if workload.controller_owned(obj) and _placed(kind, obj) and _placed_by_owner(kind, obj):
        return _repaired(request, obj, index, config) if kind == "Pod" else _result(request, "ignored")
    if workload.bound(kind, obj):
        return _result(request, "ignored")  # the scheduler is bypassed: affinity could only get it rejected
    if workload.made_for_group(kind, obj):
        return _result(request, "ignored")  # an operator's StatefulSet: its pods are placed as group members
    if (request.operation == "CREATE" and _placed(kind, obj)
            and injection.reservation_of(workload.pod_template(kind, obj)) == _reservation_key(request, obj)
            and _sealed_if_gated(workload.pod_template(kind, obj), request.namespace, config)):
        # Our own output, whole and for this very object (reinvocation): placing it again could only
        # move it. A copy of another object's output carries that object's key and is placed afresh,
        # and so is a gated one whose seal is not ours (`mutate`'s output, or edited).
        return _result(request, "ignored")
    who = workload.display_name(kind, obj, request.namespace)
    ready, why = readiness
    if not ready:
        return _result(request, "not-ready", warnings=[
            f"topology-webhook is not ready ({why or 'no cluster view yet'}); {who} admitted without placement"])
    try:
        wanted = workload.read(kind, mutation.without_injection(obj, kind), request.namespace, index)
    except InvalidWorkload as err:
        return _denied(request, str(err))
    if request.old is not None and _placed(kind, request.old) and not admitted_by_queue:
        return _kept(request, request.old, index, config, wanted)
    if workload.suspended(kind, obj):
        return _result(request, "suspended", warnings=[
            *wanted.warnings, f"{who} is suspended: nothing is placed or held until it is un-suspended"])
    if wanted.unknown:  # never a guess: admitted as written, and counted (outcome demand-unknown)
        return _result(request, "demand-unknown", warnings=list(wanted.warnings))
    key = wanted.group.key if wanted.group is not None else _reservation_key(request, obj)
    if wanted.request is None:
        group = group_decision(index, key) if workload.group_of(kind, obj, request.namespace) else None
        if group is not None:  # a launcher or head of a placed group: kept with it, holding no GPU
            return _result(request, "placed", decision=group, mutated=mutation.mutate(obj, kind, group, config, key),
                           warnings=[*wanted.warnings, f"{who} asks for no GPU; pinned with {group.request.workload}"])
        mutated = mutation.mutate(obj, kind, None, config)
        return _result(request, "ignored", mutated=mutated, warnings=[
            *wanted.warnings, f"{who} {wanted.idle}"])
    if wanted.group is not None:
        decision, alone, joined = place_group(index, wanted.request, key, reserve=not request.dry_run)
        if joined:
            alone = [*alone, *_joined_notes(who, wanted.request, decision)]
    else:
        reserve = key if KINDS[kind].reserves and not request.dry_run else None
        decision, alone = place_shared(index, wanted.request, reserve)
    if decision.outcome is Outcome.NEVER:
        return _denied(request, _never_message(who, obj, kind, decision), decision)
    mutated = provisioning.consumed_by(mutation.mutate(obj, kind, decision, config, key), kind, None)
    if provisioning.wanted(decision, config) and index.scale_ups is not None and not request.dry_run:
        mutated, note = _scale_up(request, index.scale_ups, mutated, decision, key, config)
        alone = [*alone, note]
    outcome = _WAITS_BY_CODE.get(decision.code or "", _OUTCOMES[decision.outcome])
    return _result(request, outcome, decision=decision, mutated=mutated,
                   warnings=[*wanted.warnings, *mutation.warnings(decision, config), *alone])


def _pod_group(request: _Request, obj: dict, config: Config) -> AdmissionResult:
    """A PodGroup or Workload at its CREATE: the level its annotation asks for becomes its
    topology constraint (webhook/objects/podgroups.py)."""
    try:
        written, _ = podgroups.constrained(request.kind, obj, request.namespace, config)
    except InvalidWorkload as err:
        return _denied(request, str(err))
    return _result(request, "ignored") if written is None else _result(request, "constrained", mutated=written)


def _claim_template(request: _Request, obj: dict, index: "ClusterIndex") -> AdmissionResult:
    """A ResourceClaimTemplate at its CREATE: the device alignment it asks for, as a constraint
    (webhook/objects/alignment.py)."""
    try:
        written, warnings = alignment.aligned(obj, request.namespace, index.is_gpu_class)
    except InvalidWorkload as err:
        return _denied(request, str(err))
    return _result(request, "ignored" if written is None else "aligned", mutated=written, warnings=warnings)


def _scale_up(request: _Request, scale_ups: "ScaleUps", mutated: dict, decision: Decision, key: str,
              config: Config) -> tuple[dict, str]:
    """A ProvisioningRequest for the group's pods, as admitted (created once per workload: again,
    it is found there), and the pods made to consume it; without it, they wait for an ordinary
    scale-up. Returns the object and the warning that says which."""
    who, kind, namespace = decision.request.workload, request.kind, request.namespace
    name, provisioning_class = provisioning.request_name(key), config.provisioning_request_class
    owner = next((o for o in (mutated.get("metadata") or {}).get("ownerReferences") or ()
                  if isinstance(o, Mapping) and o.get("controller") is True and o.get("uid")), None)
    objects = provisioning.request_objects(namespace, name, workload.pod_template(kind, mutated) or {},
                                           decision.request.pods, provisioning_class, owner)
    problem = scale_ups.create(objects)
    if problem is not None:
        return mutated, f"{who}: no ProvisioningRequest ({problem}); it waits for an ordinary scale-up"
    return (provisioning.consumed_by(mutated, kind, name, provisioning_class),
            f"{who}: ProvisioningRequest {namespace}/{name} ({provisioning_class}) asks for the nodes of its "
            f"{decision.request.pods} pods at once")


def _joined_notes(who: str, request: PlacementRequest, decision: Decision) -> list[str]:
    """A member joins the decision its group's first member got; say where that differs from
    what this member asks for."""
    first = decision.request
    if request.gpus_per_pod == first.gpus_per_pod:
        return []
    return [f"{who}: asks for {request.gpus_per_pod} GPUs, but {first.workload} was placed for pods of "
            f"{first.gpus_per_pod} GPUs by its first pod; pinned with the group"]


def _repaired(request: _Request, obj: dict, index: "ClusterIndex", config: Config) -> AdmissionResult:
    """A pod its controller made from a template we placed (a replacement, after a node was lost)
    keeps that placement, unless the domain it is pinned to can never hold it again: in-service
    capacity there, less what the workload's own bound pods take, has no room for one more pod.
    Then this pod alone is pinned to the nearest domain with room (as preferred-domain widens),
    never wider than the workload's max-domain and always inside the user's own constraints."""
    pinned = injection.recorded(obj).required
    named = [e for e in (pinned[0] if pinned else ()) if e.get("operator") == "In"]
    if not named:  # only preferred, or only unnamed domains: nothing to read the capacity of by label
        return _result(request, "ignored")
    if any(e.get("key") in POOL_LABELS for e in pinned[0]):
        return _result(request, "ignored")  # steered to a pool that grows: its nodes are yet to come
    key = injection.reservation_of(obj)
    try:
        gpus = pod_gpus(obj.get("spec") or {})
    except ValueError:
        return _result(request, "ignored")
    if gpus == 0 or index.room_ever(pinned[0], gpus, key) > 0:
        return _result(request, "ignored")  # busy at most: it waits for its domain, as placed
    try:
        wanted = workload.read("Pod", mutation.without_injection(obj, "Pod"), request.namespace)
    except InvalidWorkload:
        return _result(request, "ignored")
    if wanted.request is None:
        return _result(request, "ignored")
    who = workload.display_name("Pod", obj, request.namespace)
    deepest = named[-1]
    domain = f"{deepest['key']}={deepest['values'][0]}"
    if wanted.request.max_domain is not None:
        return _result(request, "ignored", warnings=[
            f"{who}: {domain} can no longer hold it, and max-domain {wanted.request.max_domain} keeps it there: "
            "it waits until capacity returns"])
    alone = dataclasses.replace(wanted.request, workload=who, pods=1, strategy=Strategy.CONSOLIDATED,
                                preferred_domain=domain)
    decision = place(index, alone)
    if decision.outcome is not Outcome.PLACED:
        return _result(request, "ignored")
    mutated = mutation.mutate(obj, "Pod", decision, config, key)
    return _result(request, "repaired", decision=decision, mutated=mutated, warnings=[
        f"{who}: {domain} can no longer hold it (its capacity is gone, not busy); this pod alone is pinned to "
        f"{decision.scope}, the nearest domain with room"])


def _kept(request: _Request, old: dict, index: "ClusterIndex", config: Config, wanted: workload.Workload
          ) -> AdmissionResult:
    """An UPDATE of a workload we placed: put our placement back, never move running work. If what
    it asks for changed, say so: re-placing would roll every pod."""
    kind, obj = request.kind, request.obj
    assert obj is not None, "an UPDATE carries its object (_parse checked)"
    warnings = list(wanted.warnings)
    try:
        before = workload.read(kind, mutation.without_injection(old, kind), request.namespace,
                               index).request
    except InvalidWorkload:
        before = None
    if before != wanted.request:
        warnings.append(f"{workload.display_name(kind, obj, request.namespace)}: placement inputs changed; "
                        "the placement made at creation is kept (recreate the workload to place it again)")
    mutated = mutation.carry_over(old, obj, kind, config)
    return _result(request, "ignored", mutated=mutated, warnings=warnings)


def _released(request: _Request, index: "ClusterIndex") -> AdmissionResult:
    """A workload we placed is being deleted or suspended: free the GPUs its unbound pods still hold. Only the
    workload's own key: a Job's pods and a Deployment's ReplicaSets carry their owner's key, and
    deleting one of them does not end the owner. Dry runs release nothing."""
    kind, old = request.kind, request.old
    if old is None or request.dry_run or not workload.supports(request.group, kind) or not KINDS[kind].reserves:
        return _result(request, "ignored")
    key = injection.reservation_of(workload.pod_template(kind, old))
    if key is None or not held_by(key, request.namespace, kind):
        return _result(request, "ignored")
    consumed = workload.annotations_of(kind, old).get(provisioning.CONSUME)
    if index.scale_ups is not None and consumed == provisioning.request_name(key):
        index.scale_ups.delete(request.namespace, consumed)  # the group is gone: so is its scale-up
    release_shared(index, key)
    return _result(request, "released")


def _deeper_than(obj: object, limit: int) -> bool:
    """Whether any value in `obj` sits more than `limit` containers deep (iteratively: the check
    must not itself recurse)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _placed_by_owner(kind: str, obj: Mapping) -> bool:
    """A controller-made object carrying a placement made for its owner: a Pod or ReplicaSet from
    a template we placed, or an operator's child (a JobSet's Jobs, a RayJob's RayCluster) whose
    template carries the key of an owner that holds GPUs. A CronJob's Jobs are placed afresh."""
    if KINDS[kind].placed_by_owner:
        return True
    owner_kind = (injection.reservation_of(workload.pod_template(kind, obj)) or "").split("/")[1:2]
    return bool(owner_kind) and owner_kind[0] != kind and owner_kind[0] in KINDS and KINDS[owner_kind[0]].reserves


def _placed(kind: str, obj: Mapping) -> bool:
    return injection.already_placed(workload.pod_template(kind, obj))


def _sealed_if_gated(template: Mapping | None, namespace: str, config: Config) -> bool:
    """A template our gate holds carries a record sealed with this webhook's key."""
    if not injection.recorded(template).gated:
        return True
    return not isinstance(injection.gate_record(injection.annotations_of(template), namespace, config.seal_key), str)


def _never_message(who: str, obj: Mapping, kind: str, decision: Decision) -> str:
    """The denial: the object, the annotation that asked for the impossible, and why."""
    reason = decision.reasons[0] if decision.reasons else str(decision.code)
    annotations = workload.annotations_of(kind, obj)
    culprit = {UNKNOWN_DOMAIN: PREFERRED_DOMAIN, EXCEEDS_CLUSTER: GPU_COUNT,
               GROUP_MISMATCH: GROUP_SIZE}.get(decision.code or "")
    if decision.code in (UNKNOWN_LEVEL, EXCEEDS_MAX_DOMAIN):
        culprit = next((k for k in (MAX_DOMAIN, *PEER_REQUIRED) if k in annotations), None)
    if culprit in annotations:
        return f"{who}: annotation {culprit}={quoted(annotations[culprit])}: {reason}"
    return reason if who in reason else f"{who}: {reason}"


def _reservation_key(request: _Request, obj: Mapping) -> str:
    """namespace/kind/name; a generateName object keeps the key already written on it (a second
    call has a new request uid) when that key can be its own, else gets generateName + request uid.

    The annotation is client input: a key of another namespace, kind or owner would let this
    object replace (and so release) someone else's hold. Only these are taken: this object's own
    key (namespace/kind/generateName...), or the key of a workload that controls it in its
    namespace (a Job's pods carry the Job's key)."""
    group = workload.group_of(request.kind, obj, request.namespace)
    if group is not None:
        return group.key  # a group's pods hold, and confirm, under the group's one key
    meta = obj.get("metadata") or {}
    if meta.get("name"):
        return reservation_key(request.namespace, request.kind, meta["name"])
    generate_name = str(meta.get("generateName") or "")
    written = str(workload.annotations_of(request.kind, obj).get(mutation.RESERVATION) or "")
    owners = [reservation_key(request.namespace, str(o.get("kind")), str(o.get("name")))
              for o in meta.get("ownerReferences") or () if isinstance(o, Mapping) and o.get("controller") is True]
    if written and (written.startswith(reservation_key(request.namespace, request.kind, generate_name))
                    or written in owners):
        return written
    return reservation_key(request.namespace, request.kind, f"{generate_name}{request.uid}")


def _denied(request: _Request, message: str, decision: Decision | None = None) -> AdmissionResult:
    return _result(request, "denied", decision=decision, status={"code": DENIED_CODE, "message": _one_line(message)})


def _result(request: _Request, outcome: str, decision: Decision | None = None, mutated: dict | None = None,
            warnings: list[str] | None = None, status: dict | None = None, error: str | None = None) -> AdmissionResult:
    """The answer. `mutated`: the object as we would have it (its JSON Patch from the received
    object goes into the answer); None leaves the object as it came."""
    operations = make_patch(request.obj, mutated) if mutated is not None and request.obj is not None else []
    clean: list[str] = []
    for text in warnings or ():
        line = _one_line(text)[:WARNING_MAX_CHARS]
        if line and line not in clean:
            clean.append(line)
    response: dict = {"uid": request.uid, "allowed": status is None}
    if operations:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode(operations)
    if status is not None:
        response["status"] = status
    if clean:
        response["warnings"] = clean
    audit = _audit(outcome, decision)
    if audit:
        response["auditAnnotations"] = audit
    strategy = decision.request.strategy.value if decision is not None else None
    return AdmissionResult(
        review={"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response},
        uid=request.uid, kind=request.kind, namespace=request.namespace, name=request.name, outcome=outcome,
        strategy=strategy, decision=decision, warnings=tuple(clean), error=error, patch=tuple(operations),
        admitted=None if status is not None else (mutated if mutated is not None else request.obj))


def _audit(outcome: str, decision: Decision | None) -> dict[str, str]:
    """Audit annotations (stored as <webhook name>/<key>); keys are valid label name segments."""
    if outcome == "ignored":
        return {}
    audit = {"outcome": outcome}
    if decision is not None:
        audit["strategy"] = decision.request.strategy.value
        audit["gpus"] = str(decision.request.total_gpus)
        if decision.scope is not None:
            audit["domain"] = str(decision.scope)
        if decision.code:
            audit["reason"] = decision.code
    return audit


def _one_line(text: str) -> str:
    return _CONTROL.sub(" ", str(text)).strip()

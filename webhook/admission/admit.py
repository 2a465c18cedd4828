"""What one review is answered with: which objects and operations we handle, and in what order
the questions are asked (the envelope is envelope.py; UPDATE and DELETE of placed workloads,
lifecycle.py; controller-made replacements, repair.py).

An exception anywhere below `review` is a bug: the object is admitted unmodified with a warning
(fail open), logged, and reported as outcome "failed-open" for the app to count.

Flow: kind and operation we handle -> object of ours -> the fields we use have their API types ->
not a pod of a template we already placed (unless its pinned domain lost the capacity to
ever hold it: then it alone is repaired), not bound to a node -> ready -> read the request (from
the object without our earlier additions) -> an UPDATE of a workload we placed keeps that
placement -> a suspended workload waits for its queue (placed on the UPDATE that un-suspends it)
-> place and reserve -> mutate -> JSONPatch -> response. A DELETE of a workload we
placed releases what its reservation still holds, and is always allowed.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..core import injection
from ..settings.config import Config
from ..core.model import (EXCEEDS_CLUSTER, EXCEEDS_MAX_DOMAIN, GROUP_MISMATCH, GROWS_POOL, UNKNOWN_DOMAIN,
                          UNKNOWN_LEVEL, Decision, Outcome, PlacementRequest, quoted)
from ..objects import alignment, mutation, podgroups, provisioning, workload
from ..objects.groups import GROUP_SIZE
from ..objects.kinds import KINDS
from ..objects.user_annotations import GPU_COUNT, MAX_DOMAIN, PEER_REQUIRED, PREFERRED_DOMAIN, InvalidWorkload
from ..placement.placer import group_decision, place_group, place_shared
from ..state.holds import reservation_key
from .envelope import AdmissionOutcome, AdmissionResult, Request, answer, denied, parse
from .lifecycle import kept, released
from .repair import placed_by_owner, repaired

if TYPE_CHECKING:
    from ..state.index import ClusterIndex, ScaleUps

log = logging.getLogger(__name__)

# Objects of the kinds we handle nest about 20 levels at most (managedFields included); far deeper
# would exhaust Python's recursion in copying and diffing, so it is denied up front.
MAX_DEPTH = 100
_OUTCOMES = {Outcome.PLACED: AdmissionOutcome.PLACED, Outcome.WAIT: AdmissionOutcome.WAITING}
# Waits the nodes there are cannot end, counted apart: only added nodes (a pool's, or any) can.
_WAITS_BY_CODE = {GROWS_POOL: AdmissionOutcome.WAITING_FOR_GROWTH,
                  **dict.fromkeys(mutation.WAITS_FOR_NODES, AdmissionOutcome.WAITING_FOR_NODES)}


def review(body: object, index: "ClusterIndex", config: Config,
           readiness: tuple[bool, str] = (True, "")) -> AdmissionResult:
    """Raises MalformedReview for a body that is not an AdmissionReview; never anything else."""
    request = parse(body)
    try:
        return _admit(request, index, config, readiness)
    except Exception as err:  # fail open: a bug of ours must not block the user's workload
        error = f"{type(err).__name__}: {err}"[:300]
        log.exception("failed open on %s %s/%s (uid %s)", request.kind, request.namespace, request.name, request.uid)
        who = f"{request.kind} {request.namespace}/{request.name}"
        return answer(request, AdmissionOutcome.FAILED_OPEN, warnings=[
            f"topology-webhook failed on {who} ({type(err).__name__}); admitted without topology placement"],
            error=error)


def _admit(request: Request, index: "ClusterIndex", config: Config,
           readiness: tuple[bool, str]) -> AdmissionResult:
    kind, obj = request.kind, request.obj
    if request.operation == "DELETE":
        return released(request, index)
    if obj is not None and request.operation == "CREATE" and podgroups.handles(request.group, kind):
        return _pod_group(request, obj, config)
    if obj is not None and request.operation == "CREATE" and alignment.handles(request.group, kind):
        return _claim_template(request, obj, index)
    if obj is None or not workload.supports(request.group, kind) or not workload.is_ours(kind, obj, config):
        return answer(request, AdmissionOutcome.IGNORED)
    # Un-suspended (a queue such as Kueue admitted it): placed now, as if created now, inside the
    # node selection the queue wrote; the template's scheduling fields may change in this update.
    admitted_by_queue = (request.operation == "UPDATE" and workload.suspended(kind, request.old)
                         and not workload.suspended(kind, obj))
    if (request.operation == "UPDATE" and request.old is not None and workload.suspended(kind, obj)
            and not workload.suspended(kind, request.old)):
        # Suspended again (its queue preempted it): its pods go, and so does the hold for the ones
        # not bound yet; un-suspended later, it is placed afresh.
        return released(request, index)
    if request.operation not in KINDS[kind].operations and not admitted_by_queue:
        return answer(request, AdmissionOutcome.IGNORED)
    if _deeper_than(obj, MAX_DEPTH):
        return denied(request, f"{workload.display_name(kind, obj, request.namespace)}: the object is nested more "
                                f"than {MAX_DEPTH} levels deep; allowed: at most {MAX_DEPTH} levels")
    try:
        workload.check_shape(kind, obj, request.namespace)
    except InvalidWorkload as err:
        return denied(request, str(err))
    if workload.controller_owned(obj) and _placed(kind, obj) and placed_by_owner(kind, obj):
        return repaired(request, obj, index, config) if kind == "Pod" else answer(request, AdmissionOutcome.IGNORED)
    if workload.bound(kind, obj):
        return answer(request, AdmissionOutcome.IGNORED)  # the scheduler is bypassed: affinity could only get it rejected
    if workload.made_for_group(kind, obj):
        return answer(request, AdmissionOutcome.IGNORED)  # an operator's StatefulSet: its pods are placed as group members
    if (request.operation == "CREATE" and _placed(kind, obj)
            and injection.reservation_of(workload.pod_template(kind, obj)) == _reservation_key(request, obj)
            and _sealed_if_gated(workload.pod_template(kind, obj), request.namespace, config)):
        # Our own output, whole and for this very object (reinvocation): placing it again could only
        # move it. A copy of another object's output carries that object's key and is placed afresh,
        # and so is a gated one whose seal is not ours (`mutate`'s output, or edited).
        return answer(request, AdmissionOutcome.IGNORED)
    who = workload.display_name(kind, obj, request.namespace)
    ready, why = readiness
    if not ready:
        return answer(request, AdmissionOutcome.NOT_READY, warnings=[
            f"topology-webhook is not ready ({why or 'no cluster view yet'}); {who} admitted without placement"])
    try:
        wanted = workload.read(kind, mutation.without_injection(obj, kind), request.namespace, index)
    except InvalidWorkload as err:
        return denied(request, str(err))
    if request.old is not None and _placed(kind, request.old) and not admitted_by_queue:
        return kept(request, request.old, index, config, wanted)
    if workload.suspended(kind, obj):
        return answer(request, AdmissionOutcome.SUSPENDED, warnings=[
            *wanted.warnings, f"{who} is suspended: nothing is placed or held until it is un-suspended"])
    if wanted.unknown:  # never a guess: admitted as written, and counted (outcome demand-unknown)
        return answer(request, AdmissionOutcome.DEMAND_UNKNOWN, warnings=list(wanted.warnings))
    key = wanted.group.key if wanted.group is not None else _reservation_key(request, obj)
    if wanted.request is None:
        group = group_decision(index, key) if workload.group_of(kind, obj, request.namespace) else None
        if group is not None:  # a launcher or head of a placed group: kept with it, holding no GPU
            return answer(request, AdmissionOutcome.PLACED, decision=group, mutated=mutation.mutate(obj, kind, group, config, key),
                           warnings=[*wanted.warnings, f"{who} asks for no GPU; pinned with {group.request.workload}"])
        mutated = mutation.mutate(obj, kind, None, config)
        return answer(request, AdmissionOutcome.IGNORED, mutated=mutated, warnings=[
            *wanted.warnings, f"{who} {wanted.idle}"])
    if wanted.group is not None:
        decision, alone, joined = place_group(index, wanted.request, key, reserve=not request.dry_run)
        if joined:
            alone = [*alone, *_joined_notes(who, wanted.request, decision)]
    else:
        reserve = key if KINDS[kind].reserves and not request.dry_run else None
        decision, alone = place_shared(index, wanted.request, reserve)
    if decision.outcome is Outcome.NEVER:
        return denied(request, _never_message(who, obj, kind, decision), decision)
    mutated = provisioning.consumed_by(mutation.mutate(obj, kind, decision, config, key), kind, None)
    if provisioning.wanted(decision, config) and index.scale_ups is not None and not request.dry_run:
        mutated, note = _scale_up(request, index.scale_ups, mutated, decision, key, config)
        alone = [*alone, note]
    outcome = _WAITS_BY_CODE.get(decision.code or "", _OUTCOMES[decision.outcome])
    return answer(request, outcome, decision=decision, mutated=mutated,
                   warnings=[*wanted.warnings, *mutation.warnings(decision), *alone])


def _pod_group(request: Request, obj: dict, config: Config) -> AdmissionResult:
    """A PodGroup or Workload at its CREATE: the level its annotation asks for becomes its
    topology constraint (webhook/objects/podgroups.py)."""
    try:
        written, _ = podgroups.constrained(request.kind, obj, request.namespace, config)
    except InvalidWorkload as err:
        return denied(request, str(err))
    return answer(request, AdmissionOutcome.IGNORED) if written is None else answer(request, AdmissionOutcome.CONSTRAINED, mutated=written)


def _claim_template(request: Request, obj: dict, index: "ClusterIndex") -> AdmissionResult:
    """A ResourceClaimTemplate at its CREATE: the device alignment it asks for, as a constraint
    (webhook/objects/alignment.py)."""
    try:
        written, warnings = alignment.aligned(obj, request.namespace, index.is_gpu_class)
    except InvalidWorkload as err:
        return denied(request, str(err))
    return answer(request, AdmissionOutcome.IGNORED if written is None else AdmissionOutcome.ALIGNED, mutated=written, warnings=warnings)


def _scale_up(request: Request, scale_ups: "ScaleUps", mutated: dict, decision: Decision, key: str,
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


def _reservation_key(request: Request, obj: Mapping) -> str:
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

"""What one review is answered with: which objects and operations we handle, and in what order
the questions are asked (the envelope is envelope.py; UPDATEs of placed workloads,
lifecycle.py; controller-made replacements, repair.py).

An exception anywhere below `review` is a bug: the object is admitted unmodified with a warning
(fail open), logged, and reported as outcome "failed-open" for the app to count.

Flow: kind and operation we handle -> object of ours -> the fields we use have their API types ->
not a pod of a template we already placed (unless its pinned domain lost the capacity to
ever hold it: then it alone is repaired), not bound to a node -> ready -> read the request (from
the object without our earlier additions) -> an UPDATE of a workload we placed keeps that
placement -> a suspended workload waits for its queue (placed on the UPDATE that un-suspends it)
-> place and reserve -> mutate -> JSONPatch -> response. A DELETE is allowed and frees
nothing: what a deleted workload held goes when the watch shows it deleted (state/holds.py).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..core import injection
from ..settings.config import Config
from ..core.model import (ANNOTATION_PREFIX, EXCEEDS_CLUSTER, EXCEEDS_MAX_DOMAIN, GROUP_MISMATCH, GROWS_POOL, UNKNOWN_DOMAIN,
                          UNKNOWN_LEVEL, Decision, Outcome, PlacementRequest, quoted)
from ..objects import alignment, mutation, podgroups, provisioning, workload
from ..objects.groups import GROUP_SIZE
from ..objects.subject import Subject
from ..objects.templates import pod_template
from ..objects.user_annotations import GPU_COUNT, MAX_DOMAIN, PEER_REQUIRED, PREFERRED_DOMAIN, InvalidWorkload
from ..placement.placer import group_decision, place_group, place_shared
from .envelope import AdmissionOutcome, AdmissionResult, Request, answer, denied, parse
from .lifecycle import kept
from .repair import placed_by_owner, repaired

if TYPE_CHECKING:
    from ..state.index import ClusterIndex
    from ..state.ports import ScaleUps

log = logging.getLogger(__name__)

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
    if request.operation == "DELETE":  # frees nothing: a deletion is believed when the watch shows it
        return answer(request, AdmissionOutcome.IGNORED)
    if obj is not None and request.operation == "CREATE" and podgroups.handles(request.group, kind):
        return _pod_group(request, obj, config)
    if obj is not None and request.operation == "CREATE" and alignment.handles(request.group, kind):
        return _claim_template(request, obj, index)
    if obj is None:
        return answer(request, AdmissionOutcome.IGNORED)
    # The object read once: every question below is answered from its pod templates, found once.
    subject = Subject(kind, request.group, obj, request.namespace, request.old)
    if not subject.supported and subject.asks_for_placement:
        return answer(request, AdmissionOutcome.IGNORED, warnings=[
            f"{subject.who} ({request.group or 'core'}): not a kind topology-webhook places; its topology.scheduler "
            "annotations are ignored (docs/reference/kinds.md)"])
    if not subject.ours(config):
        return answer(request, AdmissionOutcome.IGNORED)
    manager = subject.managed_elsewhere(config)
    if manager is not None:  # never ours to place, hold or block, whatever it carries
        return answer(request, AdmissionOutcome.MANAGED_ELSEWHERE, warnings=_elsewhere(subject, manager))
    old = subject.old
    # Un-suspended (a queue such as Kueue admitted it): placed now, as if created now, inside the
    # node selection the queue wrote, changing only what the apiserver lets this update change.
    admitted_by_queue = (request.operation == "UPDATE" and old is not None and old.suspended
                         and not subject.suspended)
    if admitted_by_queue and old is not None and old.started:
        return answer(request, AdmissionOutcome.IGNORED, warnings=[
            f"{subject.who} ran before it was suspended: the apiserver keeps its pod template as it is, "
            "so it is not placed"])
    if request.operation not in subject.placed_kind.operations and not admitted_by_queue:
        return answer(request, AdmissionOutcome.IGNORED)
    try:
        subject.check()
    except InvalidWorkload as err:
        return denied(request, str(err))
    if subject.controller_owned and subject.placed and placed_by_owner(subject):
        return repaired(request, subject, index, config) if kind == "Pod" else answer(request, AdmissionOutcome.IGNORED)
    if subject.bound:
        return answer(request, AdmissionOutcome.IGNORED)  # the scheduler is bypassed: affinity could only get it rejected
    if subject.made_for_group:
        return answer(request, AdmissionOutcome.IGNORED)  # an operator's StatefulSet: its pods are placed as group members
    if (request.operation == "CREATE" and subject.placed and not subject.suspended and subject.written_key == subject.reservation_key(request.uid)
            and _sealed_if_gated(subject.template, request.namespace, config)):
        # Our own output, whole and for this very object (reinvocation): placing it again could only
        # move it. A copy of another object's output carries that object's key and is placed afresh,
        # and so is a gated one whose seal is not ours (`mutate`'s output, or edited).
        return answer(request, AdmissionOutcome.IGNORED)
    who = subject.who
    ready, why = readiness
    if not ready:
        return answer(request, AdmissionOutcome.NOT_READY, warnings=[
            f"topology-webhook is not ready ({why or 'no cluster view yet'}); {who} admitted without placement"])
    try:
        wanted = workload.read(mutation.without_injection(subject), index)
    except InvalidWorkload as err:
        return denied(request, str(err))
    if old is not None and old.placed and not admitted_by_queue:
        return kept(request, subject, index, config, wanted)
    if subject.suspended:
        # Created suspended, it carries nothing of ours (a placement written before a later webhook
        # suspended it, on reinvocation, is taken back) and names the scheduler its pods will have:
        # once it is un-suspended only its scheduling directives may change.
        return answer(request, AdmissionOutcome.SUSPENDED, warnings=[
            *wanted.warnings, f"{who} is suspended: nothing is placed or held until it is un-suspended"],
            mutated=mutation.mutate(obj, subject.placed_kind, None, config) if request.operation == "CREATE" else None)
    if wanted.unknown:  # never a guess: admitted as written, and counted (outcome demand-unknown)
        return answer(request, AdmissionOutcome.DEMAND_UNKNOWN, warnings=list(wanted.warnings))
    key = wanted.group.key if wanted.group is not None else subject.reservation_key(request.uid)
    if wanted.request is None:
        group = group_decision(index, key) if subject.group else None
        if group is not None:  # a launcher or head of a placed group: kept with it, holding no GPU
            return answer(request, AdmissionOutcome.PLACED, decision=group, mutated=mutation.mutate(obj, subject.placed_kind, group, config, key),
                           warnings=[*wanted.warnings, f"{who} asks for no GPU; pinned with {group.request.workload}"])
        mutated = mutation.mutate(obj, subject.placed_kind, None, config)
        return answer(request, AdmissionOutcome.IGNORED, mutated=mutated, warnings=[
            *wanted.warnings, f"{who} {wanted.idle}"])
    # What this admission holds counts until the apiserver is seen to store it (state/holds.py):
    # the stored object says so by this review's uid.
    stamp = request.uid if index.holds_provisional() and not request.dry_run else None
    joined = False
    if wanted.group is not None:
        decision, alone, joined = place_group(index, wanted.request, key, reserve=not request.dry_run, stamp=stamp)
        if joined:
            alone = [*alone, *_joined_notes(who, wanted.request, decision)]
    else:
        reserve = key if subject.placed_kind.reserves and not request.dry_run else None
        decision, alone = place_shared(index, wanted.request, reserve, stamp=stamp)
        stamp = stamp if reserve is not None else None
    if decision.outcome is Outcome.NEVER:
        return denied(request, _never_message(subject, decision), decision)
    placed_kind = subject.placed_kind
    mutated = provisioning.consumed_by(mutation.mutate(obj, placed_kind, decision, config, key, admitted_by_queue),
                                       placed_kind, None)
    if stamp is not None and not joined and decision.outcome is Outcome.PLACED:
        mutated = mutation.stamped(mutated, key, stamp)
    if provisioning.wanted(decision, config) and index.scale_ups is not None and not request.dry_run:
        mutated, note = _scale_up(subject, index.scale_ups, mutated, decision, key, config)
        alone = [*alone, note]
    outcome = _WAITS_BY_CODE.get(decision.code or "", _OUTCOMES[decision.outcome])
    return answer(request, outcome, decision=decision, mutated=mutated,
                   warnings=[*wanted.warnings, *mutation.warnings(decision), *alone])


def _elsewhere(subject: Subject, manager: str) -> list[str]:
    """Why a workload that asks for our placement is left to `manager` (nothing for one that
    carries only the peer's own annotations)."""
    if not any(str(key).startswith(ANNOTATION_PREFIX) for key in subject.annotations):
        return []
    return [f"{subject.who} is placed by {manager}: its topology.scheduler annotations are not applied and "
            "nothing is held for it (docs/operators-and-queues.md)"]


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


def _scale_up(subject: Subject, scale_ups: "ScaleUps", mutated: dict, decision: Decision, key: str,
              config: Config) -> tuple[dict, str]:
    """A ProvisioningRequest for the group's pods, as admitted (created once per workload: again,
    it is found there), and the pods made to consume it; without it, they wait for an ordinary
    scale-up. Returns the object and the warning that says which."""
    who, kind, namespace = decision.request.workload, subject.placed_kind, subject.namespace
    name, provisioning_class = provisioning.request_name(key), config.provisioning_request_class
    owner = next((o for o in subject.controllers if o.get("uid")), None)
    objects = provisioning.request_objects(namespace, name, pod_template(kind, mutated) or {},
                                           decision.request.pods, provisioning_class, owner)
    problem = scale_ups.create(objects)
    if problem is not None:
        return mutated, f"{who}: no ProvisioningRequest ({problem}); it waits for an ordinary scale-up"
    # its key on the workload itself too: the watch deletes the scale-up when it sees it deleted
    return (mutation.stamped(provisioning.consumed_by(mutated, kind, name, provisioning_class), key, None),
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


def _sealed_if_gated(template: Mapping | None, namespace: str, config: Config) -> bool:
    """A template our gate holds carries a record sealed with this webhook's key."""
    if not injection.recorded(template).gated:
        return True
    return not isinstance(injection.gate_record(injection.annotations_of(template), namespace, config.seal_key), str)


def _never_message(subject: Subject, decision: Decision) -> str:
    """The denial: the object, the annotation that asked for the impossible, and why."""
    who, annotations = subject.who, subject.annotations
    reason = decision.reasons[0] if decision.reasons else str(decision.code)
    culprit = {UNKNOWN_DOMAIN: PREFERRED_DOMAIN, EXCEEDS_CLUSTER: GPU_COUNT,
               GROUP_MISMATCH: GROUP_SIZE}.get(decision.code or "")
    if decision.code in (UNKNOWN_LEVEL, EXCEEDS_MAX_DOMAIN):
        culprit = next((k for k in (MAX_DOMAIN, *PEER_REQUIRED) if k in annotations), None)
    if culprit is not None and culprit in annotations:
        return f"{who}: annotation {culprit}={quoted(annotations[culprit])}: {reason}"
    return reason if who in reason else f"{who}: {reason}"


"""Pods that controllers make from templates we placed: they keep the placement, unless the domain
they are pinned to can never hold them again (then each is placed again alone)."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..core import injection
from ..core.gpus import pod_gpus
from ..core.model import Outcome, Strategy
from ..objects import mutation, workload
from ..objects.kinds import BY_KEY, POD
from ..objects.subject import Subject
from ..objects.user_annotations import InvalidWorkload
from ..placement.placer import place
from ..settings.config import Config
from ..state.growth import POOL_LABELS
from .envelope import AdmissionOutcome, AdmissionResult, Request, answer

if TYPE_CHECKING:
    from ..state.index import ClusterIndex


def repaired(request: Request, subject: Subject, index: "ClusterIndex", config: Config) -> AdmissionResult:
    """A pod its controller made from a template we placed (a replacement, after a node was lost)
    keeps that placement, unless the domain it is pinned to can never hold it again: in-service
    capacity there, less what the workload's own bound pods take, has no room for one more pod.
    Then this pod alone is pinned to the nearest domain with room (as preferred-domain widens),
    never wider than the workload's max-domain and always inside the user's own constraints."""
    obj = subject.obj
    pinned = injection.recorded(obj).required
    named = [e for e in (pinned[0] if pinned else ()) if e.get("operator") == "In"]
    if not named:  # only preferred, or only unnamed domains: nothing to read the capacity of by label
        return answer(request, AdmissionOutcome.IGNORED)
    if any(e.get("key") in POOL_LABELS for e in pinned[0]):
        return answer(request, AdmissionOutcome.IGNORED)  # steered to a pool that grows: its nodes are yet to come
    key = subject.written_key
    try:
        gpus = pod_gpus(obj.get("spec") or {})
    except ValueError:
        return answer(request, AdmissionOutcome.IGNORED)
    if gpus == 0 or index.has_room_ever(pinned[0], gpus, key):
        return answer(request, AdmissionOutcome.IGNORED)  # busy at most: it waits for its domain, as placed
    try:
        wanted = workload.read(mutation.without_injection(subject))
    except InvalidWorkload:
        return answer(request, AdmissionOutcome.IGNORED)
    if wanted.request is None:
        return answer(request, AdmissionOutcome.IGNORED)
    who = subject.who
    deepest = named[-1]
    domain = f"{deepest['key']}={deepest['values'][0]}"
    if wanted.request.max_domain is not None:
        return answer(request, AdmissionOutcome.IGNORED, warnings=[
            f"{who}: {domain} can no longer hold it, and max-domain {wanted.request.max_domain} keeps it there: "
            "it waits until capacity returns"])
    alone = dataclasses.replace(wanted.request, workload=who, pods=1, strategy=Strategy.CONSOLIDATED,
                                preferred_domain=domain)
    decision = place(index, alone)
    if decision.outcome is not Outcome.PLACED:
        return answer(request, AdmissionOutcome.IGNORED)
    mutated = mutation.mutate(obj, POD, decision, config, key)
    return answer(request, AdmissionOutcome.REPAIRED, decision=decision, mutated=mutated, warnings=[
        f"{who}: {domain} can no longer hold it (its capacity is gone, not busy); this pod alone is pinned to "
        f"{decision.scope}, the nearest domain with room"])


def placed_by_owner(subject: Subject) -> bool:
    """A controller-made object carrying a placement made for its owner: a Pod or ReplicaSet from
    a template we placed, or an operator's child (a JobSet's Jobs, a RayJob's RayCluster) whose
    template carries the key of an owner that holds GPUs. A CronJob's Jobs are placed afresh."""
    if subject.placed_kind.placed_by_owner:
        return True
    owner = BY_KEY.get(((subject.written_key or "").split("/") + ["", ""])[1])
    return owner is not None and owner is not subject.workload_kind and owner.reserves

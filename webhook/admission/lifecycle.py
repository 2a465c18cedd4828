"""A placed workload after its creation: an UPDATE keeps the placement made at creation, and a
DELETE (or a suspension by its queue) frees what its unbound pods still hold."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..objects import mutation, provisioning, workload
from ..objects.kinds import KINDS
from ..objects.subject import Subject
from ..objects.user_annotations import InvalidWorkload
from ..placement.placer import release_shared
from ..settings.config import Config
from ..state.holds import held_by
from .envelope import AdmissionOutcome, AdmissionResult, Request, answer

if TYPE_CHECKING:
    from ..state.index import ClusterIndex


def kept(request: Request, subject: Subject, index: "ClusterIndex", config: Config, wanted: workload.Workload
         ) -> AdmissionResult:
    """An UPDATE of a workload we placed (`subject.old`): put our placement back, never move running
    work. If what it asks for changed, say so: re-placing would roll every pod."""
    old = subject.old
    assert old is not None, "an UPDATE of a placed workload carries its old object (admit checked)"
    warnings = list(wanted.warnings)
    try:
        before = workload.read(mutation.without_injection(old), index).request
    except InvalidWorkload:
        before = None
    if before != wanted.request:
        warnings.append(f"{subject.who}: placement inputs changed; "
                        "the placement made at creation is kept (recreate the workload to place it again)")
    mutated = mutation.carry_over(old, subject.obj, config)
    return answer(request, AdmissionOutcome.IGNORED, mutated=mutated, warnings=warnings)


def released(request: Request, index: "ClusterIndex") -> AdmissionResult:
    """A workload we placed is being deleted or suspended: free the GPUs its unbound pods still hold. Only the
    workload's own key: a Job's pods and a Deployment's ReplicaSets carry their owner's key, and
    deleting one of them does not end the owner. Dry runs release nothing."""
    kind = request.kind
    if request.old is None or request.dry_run:
        return answer(request, AdmissionOutcome.IGNORED)
    old = Subject(kind, request.group, request.old, request.namespace)
    if not old.supported or not KINDS[kind].reserves:
        return answer(request, AdmissionOutcome.IGNORED)
    key = old.written_key
    if key is None or not held_by(key, request.namespace, kind):
        return answer(request, AdmissionOutcome.IGNORED)
    consumed = old.annotations.get(provisioning.CONSUME)
    if index.scale_ups is not None and consumed == provisioning.request_name(key):
        index.scale_ups.delete(request.namespace, consumed)  # the group is gone: so is its scale-up
    release_shared(index, key)
    return answer(request, AdmissionOutcome.RELEASED)

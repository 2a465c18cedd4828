"""A placed workload after its creation: an UPDATE keeps the placement made at creation, and a
DELETE (or a suspension by its queue) frees what its unbound pods still hold."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core import injection
from ..objects import mutation, provisioning, workload
from ..objects.kinds import KINDS
from ..objects.user_annotations import InvalidWorkload
from ..placement.placer import release_shared
from ..settings.config import Config
from ..state.holds import held_by
from .envelope import AdmissionOutcome, AdmissionResult, Request, answer

if TYPE_CHECKING:
    from ..state.index import ClusterIndex


def kept(request: Request, old: dict, index: "ClusterIndex", config: Config, wanted: workload.Workload
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
    return answer(request, AdmissionOutcome.IGNORED, mutated=mutated, warnings=warnings)


def released(request: Request, index: "ClusterIndex") -> AdmissionResult:
    """A workload we placed is being deleted or suspended: free the GPUs its unbound pods still hold. Only the
    workload's own key: a Job's pods and a Deployment's ReplicaSets carry their owner's key, and
    deleting one of them does not end the owner. Dry runs release nothing."""
    kind, old = request.kind, request.old
    if old is None or request.dry_run or not workload.supports(request.group, kind) or not KINDS[kind].reserves:
        return answer(request, AdmissionOutcome.IGNORED)
    key = injection.reservation_of(workload.pod_template(kind, old))
    if key is None or not held_by(key, request.namespace, kind):
        return answer(request, AdmissionOutcome.IGNORED)
    consumed = workload.annotations_of(kind, old).get(provisioning.CONSUME)
    if index.scale_ups is not None and consumed == provisioning.request_name(key):
        index.scale_ups.delete(request.namespace, consumed)  # the group is gone: so is its scale-up
    release_shared(index, key)
    return answer(request, AdmissionOutcome.RELEASED)
